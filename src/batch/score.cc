#include "batch/score.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/json_text.h"
#include "tokenizer/tokenizer.h"

namespace estream::batch {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // output keys in insertion order: "id" first

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string Dump(const ojson& o) { return DumpJson(o); }

// The key and the start of a result line: "id", and "line" for a line keyed by its number.
ojson Head(const ScoreLine& l) {
  ojson o;
  o["id"] = l.id;
  if (l.by_line) o["line"] = l.line;
  return o;
}

// A line of an existing output that estream score wrote: an object keyed by "id" (or "line")
// with "n_tokens" (a result) or "error". Anything else that parses as an object (an input line,
// say) means the output is not score's file.
bool IsScoreLine(const json& j) { return j.is_object() && (j.contains("n_tokens") || j.contains("error")); }

// Reads the output open at fd (if it has any bytes): the keys done and whether each is an error
// line; cuts a torn last line. Refuses, changing nothing, a file that holds JSON objects that
// are not result lines (the input given as the output, or another program's file).
Status ReadDone(int fd, const ScoreOptions& o, std::unordered_set<std::string>* done,
                std::unordered_map<std::string, bool>* failed) {
  std::string text;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    const ssize_t n = pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(o.output + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
  size_t good_end = 0;  // bytes of whole, parseable lines
  size_t pos = 0;
  int64_t line_no = 0;
  auto not_ours = [&](int64_t line) {
    return Status::InvalidArgument(o.output + " line " + std::to_string(line) +
                                   " is a JSON object but not a result of estream score (is it an input "
                                   "file?); give --output a new file or one that an earlier run wrote");
  };
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    ++line_no;
    const size_t line_end = nl == std::string::npos ? text.size() : nl;
    json j = json::parse(text.begin() + pos, text.begin() + line_end, nullptr, false);
    if (!j.is_discarded() && j.is_object() && !IsScoreLine(j)) return not_ours(line_no);
    if (nl == std::string::npos) break;  // torn: no newline
    Result<std::string> key = j.is_discarded() ? Result<std::string>(Status::InvalidArgument("not JSON"))
                                               : ResultKey(j);
    if (!key.ok()) {
      if (nl + 1 >= text.size()) break;  // torn last line
      if (o.warn) o.warn("warning: " + o.output + " line " + std::to_string(line_no) + " is not a result; ignored");
    } else {
      done->insert(*key);
      (*failed)[*key] = j.contains("error");
    }
    pos = nl + 1;
    good_end = pos;
  }
  if (good_end < text.size()) {
    if (o.warn)
      o.warn(o.output + " ends with a torn line (" + std::to_string(text.size() - good_end) +
             " bytes); cutting it and resuming");
    if (ftruncate(fd, static_cast<off_t>(good_end)) != 0)
      return Status::IOError(o.output + ": cannot cut the torn last line: " + std::strerror(errno));
  }
  return Status::Ok();
}

// Opens the output for appending (created when absent) and locks it: a regular file (it is read
// back to resume, and fsynced), not the input, and not being written by another Score (a
// requeued job whose old task still runs would duplicate every line).
Result<int> OpenOutput(const ScoreOptions& o) {
  const auto not_regular = [&] {
    return Status::InvalidArgument(o.output + " is not a regular file: the output is appended to, fsynced and "
                                   "read back to resume; give a file path");
  };
  // Checked before the open too: a directory cannot be opened for writing at all (EISDIR), and
  // the rule, not the errno, says what to give.
  struct stat out_st, in_st;
  if (stat(o.output.c_str(), &out_st) == 0 && !S_ISREG(out_st.st_mode)) return not_regular();
  const int fd = open(o.output.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(o.output + ": cannot open for writing: " + std::strerror(errno));
  auto fail = [&](Status st) {
    close(fd);
    return st;
  };
  if (fstat(fd, &out_st) != 0) return fail(Status::IOError(o.output + ": cannot stat: " + std::strerror(errno)));
  if (!S_ISREG(out_st.st_mode)) return fail(not_regular());
  if (stat(o.input.c_str(), &in_st) == 0 && in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
    return fail(Status::InvalidArgument(o.output + " is the input file: give the results another file"));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0)
    return fail(errno == EWOULDBLOCK
                    ? Status::IOError(o.output + " is being written by another estream score run; wait for "
                                          "it to end or give another output")
                    : Status::IOError(o.output + ": cannot lock: " + std::strerror(errno)));
  return fd;
}

// Appends `text` to fd and fsyncs it.
Status AppendDurably(int fd, const std::string& text, const std::string& path) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(path + ": write failed: " + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return Status::IOError(path + ": fsync failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

ScoreLine ParseScoreLine(const json& j, int64_t line, const Tokenizer* tokenizer, int32_t n_vocab) {
  ScoreLine it;
  it.line = line;
  if (j.is_discarded() || !j.is_object()) {
    it.error = "line " + std::to_string(line) + (j.is_discarded() ? " is not valid JSON (one object per line)"
                                                                   : " is not a JSON object");
    return it;
  }
  if (!j.contains("id")) {
    it.error = "line " + std::to_string(line) + " has no \"id\"";
    return it;
  }
  it.id = j["id"];
  auto fail = [&](const std::string& m) {
    it.error = m;
    return it;
  };
  const bool has_prompt = j.contains("prompt"), has_tokens = j.contains("tokens");
  if (has_prompt == has_tokens) return fail("give exactly one of \"prompt\" (text) and \"tokens\" (ids)");
  auto ids_of = [&](const json& a, std::vector<int32_t>* out) -> bool {
    if (!a.is_array()) return false;
    for (const json& x : a) {
      if (!x.is_number_integer()) return false;
      const int64_t v = x.get<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) return false;
      out->push_back(static_cast<int32_t>(v));
    }
    return true;
  };
  Request& req = it.request;
  if (has_tokens) {
    if (!ids_of(j["tokens"], &req.tokens)) return fail("\"tokens\" must be an array of integer ids");
  } else {
    if (!j["prompt"].is_string()) return fail("\"prompt\" must be a string");
    if (!tokenizer) return fail("the model has no tokenizer: give \"tokens\" instead of \"prompt\"");
    req.tokens = tokenizer->Encode(j["prompt"].get<std::string>(), /*add_special=*/true, false);
  }
  bool default_no_top = false;
  if (j.contains("continuations")) {
    const json& c = j["continuations"];
    if (!c.is_array() || c.empty()) return fail("\"continuations\" must be a non-empty array");
    for (const json& x : c) {
      std::vector<int32_t> ids;
      if (x.is_string()) {
        if (!tokenizer) return fail("the model has no tokenizer: give continuations as arrays of ids");
        ids = tokenizer->Encode(x.get<std::string>(), /*add_special=*/false, false);
      } else if (!ids_of(x, &ids)) {
        return fail("each continuation must be a string or an array of integer ids");
      }
      req.continuations.push_back(std::move(ids));
    }
    default_no_top = true;
  }
  if (j.contains("embedding")) {
    const json& e = j["embedding"];
    if (e == "last") req.embedding = Request::Pooling::kLast;
    else if (e == "mean") req.embedding = Request::Pooling::kMean;
    else return fail("\"embedding\" must be \"last\" or \"mean\"");
    default_no_top = true;
  }
  req.top_k = default_no_top ? 0 : 5;
  if (j.contains("top_k")) {
    if (!j["top_k"].is_number_integer()) return fail("\"top_k\" must be an integer");
    const int64_t k = j["top_k"].get<int64_t>();
    if (k < 0 || k > n_vocab) return fail("\"top_k\" must be between 0 and n_vocab = " + std::to_string(n_vocab));
    req.top_k = static_cast<int>(k);
  }
  if (j.contains("prompt_logprobs")) {
    if (!j["prompt_logprobs"].is_boolean()) return fail("\"prompt_logprobs\" must be true or false");
    req.prompt_logprobs = j["prompt_logprobs"].get<bool>();
  }
  it.tokens = static_cast<int64_t>(req.tokens.size());
  for (const auto& c : req.continuations) it.tokens += static_cast<int64_t>(c.size());
  return it;
}

std::string ScoreResultJson(const ScoreLine& l, const Response& r, const Tokenizer* tokenizer) {
  ojson o = Head(l);
  o["n_tokens"] = r.n_tokens;
  if (!r.top.empty()) {
    ojson top = ojson::array();
    for (const TokenLogprob& t : r.top) {
      ojson e = {{"token", t.token}, {"logprob", t.logprob}};
      if (tokenizer && tokenizer->IsValidId(t.token))
        e["text"] = tokenizer->Decode(std::span<const int32_t>(&t.token, 1));
      top.push_back(std::move(e));
    }
    o["top"] = std::move(top);
  }
  if (!r.continuations.empty()) {
    ojson cs = ojson::array();
    for (const ContinuationScore& c : r.continuations)
      cs.push_back({{"logprob", c.log_likelihood}, {"logprobs", c.logprobs}, {"n_tokens", c.logprobs.size()},
                    {"is_greedy", c.is_greedy}});
    o["continuations"] = std::move(cs);
  }
  if (!r.embedding.empty()) o["embedding"] = r.embedding;
  if (l.request.prompt_logprobs) {
    o["prompt_logprobs"] = r.prompt_logprobs;
    o["log_likelihood"] = r.log_likelihood;
  }
  return Dump(o);
}

std::string ScoreErrorJson(const ScoreLine& l, const std::string& error) {
  ojson o = Head(l);
  o["error"] = OneLine(error);
  return Dump(o);
}

Result<ScoreSummary> Score(Engine& engine, const Tokenizer* tokenizer, const ScoreOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  ScoreSummary sum;
  std::unordered_set<std::string> done;
  std::unordered_map<std::string, bool> failed;
  std::ifstream in(options.input, std::ios::binary);
  if (!in) return Status::IOError(options.input + ": cannot open: " + std::strerror(errno));
  ESTREAM_ASSIGN_OR_RETURN(const int fd, OpenOutput(options));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }  // also releases the lock
  } closer{fd};
  ESTREAM_RETURN_IF_ERROR(ReadDone(fd, options, &done, &failed));

  const int32_t n_vocab = engine.info().n_vocab;

  // Every input line of the shard: parsed, or skipped when the output already has it. Every
  // line's id is read (keys), so a repeated id is found wherever its first line is.
  std::vector<ScoreLine> items;
  LineKeys keys;
  int64_t total_tokens = 0;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (IsBlankLine(text)) continue;
    const json j = json::parse(text, nullptr, false);
    bool duplicate = false;
    const json id = j.is_discarded() ? json(nullptr) : IdOfLine(j);
    const std::string key = keys.Add(id, line, &duplicate);
    if (!InShard(options.shard, line - 1, id)) continue;
    if (done.count(key)) {
      ++sum.lines_skipped;
      sum.lines_failed_before += failed[key];
      continue;
    }
    ScoreLine it = ParseScoreLine(j, line, tokenizer, n_vocab);
    it.by_line = key.rfind("line:", 0) == 0;
    if (duplicate && it.error.empty()) it.error = "duplicate id " + it.id.dump() + " (an earlier line has it)";
    total_tokens += it.error.empty() ? it.tokens : 0;
    items.push_back(std::move(it));
  }
  if (in.bad()) return Status::IOError(options.input + ": read failed");

  const int64_t window_tokens =
      4 * (options.pass_tokens > 0 ? std::min(options.pass_tokens, engine.pass_tokens()) : engine.pass_tokens());
  int64_t tokens_done = 0;  // the progress's: every line that went to the engine, as total_tokens
  for (size_t w0 = 0; w0 < items.size();) {
    // A window: consecutive lines up to ~4 passes of tokens (at least one line).
    size_t w1 = w0;
    int64_t wt = 0;
    while (w1 < items.size() && (w1 == w0 || wt + items[w1].tokens <= window_tokens)) wt += items[w1++].tokens;
    std::vector<Request> batch;
    std::vector<int> slot(w1 - w0, -1);
    for (size_t i = w0; i < w1; ++i) {
      if (!items[i].error.empty()) continue;
      slot[i - w0] = static_cast<int>(batch.size());
      batch.push_back(std::move(items[i].request));
    }
    std::vector<Result<Response>> results = engine.RunBatch(batch, options.pass_tokens);
    std::string out;
    for (size_t i = w0; i < w1; ++i) {
      ScoreLine& it = items[i];
      const int s = slot[i - w0];
      bool ok = false;
      if (s < 0) {
        out += ScoreErrorJson(it, it.error);
      } else if (results[s].ok()) {
        it.request = std::move(batch[s]);  // for ScoreResultJson's flags
        out += ScoreResultJson(it, *results[s], tokenizer);
        ok = true;
      } else {
        out += ScoreErrorJson(it, results[s].status().message());
      }
      ++(ok ? sum.lines_ok : sum.lines_failed);
      if (ok) sum.tokens += it.tokens;
      if (it.error.empty()) tokens_done += it.tokens;
      out += '\n';
    }
    ESTREAM_RETURN_IF_ERROR(AppendDurably(fd, out, options.output));
    w0 = w1;
    if (options.progress)
      options.progress({.lines_done = static_cast<int64_t>(w0), .lines_total = static_cast<int64_t>(items.size()),
                        .tokens_done = tokens_done, .tokens_total = total_tokens, .seconds = elapsed()});
  }
  sum.seconds = elapsed();
  return sum;
}

}  // namespace estream::batch

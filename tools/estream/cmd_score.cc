// estream score: batch scoring of a JSONL file, resumable.
//
//   estream score -m MODEL --input IN.jsonl --output OUT.jsonl [--budget SIZE] [--batch-tokens N] [-t N]
//                 [--shard I/N [--shard-by line|id]]
//   estream score --merge OUT1.jsonl OUT2.jsonl ... -o ALL.jsonl [--input IN.jsonl]
//
// Input: one JSON object per line:
//   {"id": ANY, "prompt": "text" | "tokens": [ids...],
//    "continuations": ["text", ...] | [[ids...], ...],   optional: shared-prefix candidates
//    "embedding": "last" | "mean",                        optional
//    "top_k": K,                                          optional (default 5; 0 with continuations
//                                                         or an embedding)
//    "prompt_logprobs": true}                             optional
// A text prompt is tokenized with the model's vocabulary (BOS/EOS as the vocabulary asks); text
// continuations are tokenized without special tokens and appended as they are (so a BPE
// vocabulary wants the leading space: " Paris").
//
// Output: one JSON object per input line, in input order, with the same id:
//   {"id":..., "n_tokens": T, "top": [{"token": id, "logprob": lp, "text": "..."}],
//    "continuations": [{"logprob": sum, "logprobs": [...], "n_tokens": n, "is_greedy": b}],
//    "embedding": [...], "prompt_logprobs": [...], "log_likelihood": ll}
// or, for a line that cannot be run (bad JSON, no id, bad tokens, too long, a repeated id, ...):
//   {"id":..., "error": "one line"}
// A line whose id cannot be read, and a line repeating an earlier line's id (scored as an error),
// also carry "line": N (1-based, physical): that is their key (src/batch/shard.h).
//
// Batching: consecutive lines are taken in windows of about 4 passes (--batch-tokens tokens each);
// the engine packs each window longest first into passes (Engine::RunBatch). A window's lines are
// appended to OUT in input order, then flushed and fsynced, so OUT is always a prefix of the
// results in input order (plus at most one torn line after a crash).
//
// Resume: at start OUT is read; a torn last line (no newline, or not JSON) is cut off, and every id
// (or line number, for id-less lines) it holds is skipped: a rerun after a crash or Ctrl-C
// completes the file without duplicating or losing a line.
//
// Shards (--shard I/N, src/batch/shard.h): only the lines of shard I are scored, into this
// shard's own OUT, resumable as above (a re-queued shard continues where it stopped); every
// shard reads the whole input, so ids repeated across shards are found as in one process. Lines
// are dealt round robin by line index, or with --shard-by id by XXH64 of the id. --merge
// (src/batch/merge.h) checks that the shard outputs hold every input line exactly once and writes
// them in input order: the file one process would have written.
//
// Exit status: 0 when every input line (of the shard) has a result without error in OUT, 1
// otherwise (bad lines, a failed request, or a fatal error such as an unreadable model). --merge:
// 0 when merged and no line is an error, 1 otherwise (nothing is written when the check fails).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/memory.h"
#include "batch/merge.h"
#include "batch/shard.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/batch_options.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

using nlohmann::json;

// One input line.
struct Item {
  int64_t line = 0;  // 1-based
  json id;           // null when absent / unreadable
  bool by_line = false;  // keyed by its line number (no id, or a repeated id): "line" in its result
  std::string error; // non-empty: the line fails with this message
  Request req;
  int64_t tokens = 0;
};

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

class ScoreCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF model file (packed for --budget); required unless --merge");
    sub->add_option("--input", input_, "input JSONL: one {\"id\", \"prompt\" or \"tokens\", optional "
                    "\"continuations\", \"embedding\": \"last\"|\"mean\", \"top_k\", \"prompt_logprobs\"} per line; "
                    "with --merge: optional, checks every input line has exactly one result and gives the order");
    sub->add_option("-o,--output", output_, "output JSONL, one result per input line in input order with the same id; "
                    "if it exists, ids already in it are skipped (resume after a crash); with --merge: the merged file");
    sub->add_option("--shard", shard_, "score only shard I of N (0 <= I < N): the input lines whose index mod N "
                    "(or with --shard-by id, XXH64 of the id mod N) is I, into this shard's own --output; "
                    "resumable per shard");
    sub->add_option("--shard-by", shard_by_, "how --shard deals lines: line (index, round robin; default) or id "
                    "(hash of the id: a line keeps its shard when the file is re-ordered)");
    sub->add_option("--merge", merge_, "merge the outputs of the shards into --output (in input order with --input), "
                    "after checking every line has exactly one result (else an error listing the ids, nothing written)")
        ->expected(1, -1);
    flags_.Setup(sub);
    sub->add_flag("--no-progress", no_progress_, "no progress line on stderr (it is only shown on a terminal)");
    sub->footer(
        "Input lines: {\"id\": 1, \"prompt\": \"The capital of France is\"}\n"
        "             {\"id\": \"q7\", \"prompt\": \"Question: ...\\nAnswer:\", \"continuations\": [\" yes\", \" no\"]}\n"
        "             {\"id\": 3, \"tokens\": [1, 450, 7483], \"embedding\": \"mean\"}\n"
        "Output lines: {\"id\": 1, \"n_tokens\": 6, \"top\": [{\"token\": 3681, \"logprob\": -0.4, \"text\": \" Paris\"}, ...]}\n"
        "              {\"id\": \"q7\", \"continuations\": [{\"logprob\": -1.2, \"logprobs\": [-1.2], \"n_tokens\": 1, "
        "\"is_greedy\": true}, ...]}\n"
        "A bad line gives {\"id\": ..., \"error\": \"...\"} and the run goes on; the exit status is 1 if any line "
        "failed. Rerunning with the same --output resumes: ids already written are skipped.\n"
        "Sharded: estream score -m M --input IN.jsonl --shard 0/4 --output OUT.0.jsonl   (... 1/4, 2/4, 3/4)\n"
        "         estream score --merge OUT.0.jsonl OUT.1.jsonl OUT.2.jsonl OUT.3.jsonl --input IN.jsonl -o ALL.jsonl\n");
  }

 private:
  // Reads OUT (if any): the keys done, the number of error lines; cuts a torn last line.
  Status ReadDone(std::unordered_set<std::string>* done, std::unordered_map<std::string, bool>* failed) {
    std::ifstream in(output_, std::ios::binary);
    if (!in) return Status::Ok();  // no file yet
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t good_end = 0;  // bytes of whole, parseable lines
    size_t pos = 0;
    int64_t line_no = 0;
    while (pos < text.size()) {
      const size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) break;  // torn: no newline
      ++line_no;
      json j = json::parse(text.begin() + pos, text.begin() + nl, nullptr, false);
      Result<std::string> key = j.is_discarded() ? Result<std::string>(Status::InvalidArgument("not JSON"))
                                                 : batch::ResultKey(j);
      if (!key.ok()) {
        if (text.find('\n', nl + 1) == std::string::npos && nl + 1 >= text.size()) break;  // torn last line
        std::fprintf(stderr, "estream score: warning: %s line %lld is not a result; ignored\n", output_.c_str(),
                     static_cast<long long>(line_no));
      } else {
        done->insert(*key);
        (*failed)[*key] = j.contains("error");
      }
      pos = nl + 1;
      good_end = pos;
    }
    if (good_end < text.size()) {
      std::fprintf(stderr, "estream score: %s ends with a torn line (%zu bytes); cutting it and resuming\n",
                   output_.c_str(), text.size() - good_end);
      if (truncate(output_.c_str(), static_cast<off_t>(good_end)) != 0)
        return Status::IOError(output_ + ": cannot cut the torn last line: " + std::strerror(errno));
    }
    return Status::Ok();
  }

  // Parses one input line (j: its JSON, discarded when not JSON) into an Item (error set when it
  // cannot run).
  Item Parse(const json& j, int64_t line, const ModelInfo& info) {
    Item it;
    it.line = line;
    if (j.is_discarded() || !j.is_object()) {
      it.error = "line " + std::to_string(line) + " is not a JSON object";
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
    auto ids_of = [&](const json& a, std::vector<int32_t>* out, const char* what) -> bool {
      if (!a.is_array()) return false;
      for (const json& x : a) {
        if (!x.is_number_integer()) return false;
        const int64_t v = x.get<int64_t>();
        if (v < INT32_MIN || v > INT32_MAX) return false;
        out->push_back(static_cast<int32_t>(v));
      }
      (void)what;
      return true;
    };
    if (has_tokens) {
      if (!ids_of(j["tokens"], &it.req.tokens, "tokens")) return fail("\"tokens\" must be an array of integer ids");
    } else {
      if (!j["prompt"].is_string()) return fail("\"prompt\" must be a string");
      if (!tokenizer_) return fail("the model has no tokenizer: give \"tokens\" instead of \"prompt\"");
      it.req.tokens = tokenizer_->Encode(j["prompt"].get<std::string>(), /*add_special=*/true, false);
    }
    bool default_no_top = false;
    if (j.contains("continuations")) {
      const json& c = j["continuations"];
      if (!c.is_array() || c.empty()) return fail("\"continuations\" must be a non-empty array");
      for (const json& x : c) {
        std::vector<int32_t> ids;
        if (x.is_string()) {
          if (!tokenizer_) return fail("the model has no tokenizer: give continuations as arrays of ids");
          ids = tokenizer_->Encode(x.get<std::string>(), /*add_special=*/false, false);
        } else if (!ids_of(x, &ids, "continuation")) {
          return fail("each continuation must be a string or an array of integer ids");
        }
        it.req.continuations.push_back(std::move(ids));
      }
      default_no_top = true;
    }
    if (j.contains("embedding")) {
      const json& e = j["embedding"];
      if (e == "last") it.req.embedding = Request::Pooling::kLast;
      else if (e == "mean") it.req.embedding = Request::Pooling::kMean;
      else return fail("\"embedding\" must be \"last\" or \"mean\"");
      default_no_top = true;
    }
    it.req.top_k = default_no_top ? 0 : 5;
    if (j.contains("top_k")) {
      if (!j["top_k"].is_number_integer()) return fail("\"top_k\" must be an integer");
      const int64_t k = j["top_k"].get<int64_t>();
      if (k < 0 || k > info.n_vocab) return fail("\"top_k\" must be between 0 and n_vocab = " + std::to_string(info.n_vocab));
      it.req.top_k = static_cast<int>(k);
    }
    if (j.contains("prompt_logprobs")) {
      if (!j["prompt_logprobs"].is_boolean()) return fail("\"prompt_logprobs\" must be true or false");
      it.req.prompt_logprobs = j["prompt_logprobs"].get<bool>();
    }
    it.tokens = static_cast<int64_t>(it.req.tokens.size());
    for (const auto& c : it.req.continuations) it.tokens += static_cast<int64_t>(c.size());
    return it;
  }

  using ojson = nlohmann::ordered_json;  // output keys in insertion order: "id" first

  ojson ResultJson(const Item& it, const Response& r) const {
    ojson o;
    o["id"] = it.id;
    if (it.by_line) o["line"] = it.line;
    o["n_tokens"] = r.n_tokens;
    if (!r.top.empty()) {
      ojson top = ojson::array();
      for (const TokenLogprob& t : r.top) {
        ojson e = {{"token", t.token}, {"logprob", t.logprob}};
        if (tokenizer_ && tokenizer_->IsValidId(t.token)) e["text"] = tokenizer_->Decode(std::span<const int32_t>(&t.token, 1));
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
    if (it.req.prompt_logprobs) {
      o["prompt_logprobs"] = r.prompt_logprobs;
      o["log_likelihood"] = r.log_likelihood;
    }
    return o;
  }

  static ojson ErrorJson(const Item& it, const std::string& error) {
    ojson o;
    o["id"] = it.id;
    if (it.by_line) o["line"] = it.line;
    o["error"] = OneLine(error);
    return o;
  }

  Result<int> RunMerge() {
    if (!model_.empty()) return Status::InvalidArgument("--merge takes no --model: it only checks and joins the outputs");
    if (!shard_.empty()) return Status::InvalidArgument("--merge and --shard do not go together");
    if (output_.empty()) return Status::InvalidArgument("--merge needs the merged file: -o ALL.jsonl");
    ESTREAM_ASSIGN_OR_RETURN(batch::MergeStats st,
                             batch::MergeShardOutputs({.shard_outputs = merge_, .input = input_, .output = output_}));
    std::string per_file;
    for (size_t f = 0; f < st.lines_per_file.size(); ++f)
      per_file += (f ? ", " : "") + std::to_string(st.lines_per_file[f]);
    std::fprintf(stderr, "estream score: merged %lld lines (%s from each of the %zu outputs) into %s%s; %lld of them "
                 "are errors\n", static_cast<long long>(st.lines), per_file.c_str(), merge_.size(), output_.c_str(),
                 input_.empty() ? " (no --input: lines missing from every output cannot be detected; order as given)"
                                : ", in input order, every input line exactly once",
                 static_cast<long long>(st.error_lines));
    return st.error_lines > 0 ? 1 : 0;
  }

  Result<int> Run() override {
    if (!merge_.empty()) return RunMerge();
    // Flags first, before any work (CLI11 cannot say "required unless --merge").
    if (model_.empty()) return Status::InvalidArgument("--model is required (the model to score with)");
    if (input_.empty()) return Status::InvalidArgument("--input is required (the JSONL file to score)");
    if (output_.empty()) return Status::InvalidArgument("--output is required (where the results go)");
    batch::ShardSpec shard;
    if (!shard_.empty()) {
      ESTREAM_ASSIGN_OR_RETURN(shard, batch::ParseShardSpec(shard_, shard_by_));
    } else if (shard_by_ != "line") {
      return Status::InvalidArgument("--shard-by needs --shard I/N");
    }
    const auto start = std::chrono::steady_clock::now();
    std::unordered_set<std::string> done;
    std::unordered_map<std::string, bool> failed;
    ESTREAM_RETURN_IF_ERROR(ReadDone(&done, &failed));

    std::ifstream in(input_, std::ios::binary);
    if (!in) return Status::IOError(input_ + ": cannot open: " + std::strerror(errno));
    {
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_, {.mmap = false}));
      auto t = Tokenizer::FromGguf(*gguf);
      if (t.ok()) tokenizer_ = std::move(t).value();  // else: "tokens" lines only
    }
    ESTREAM_ASSIGN_OR_RETURN(EngineOptions eo, flags_.Options());
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, eo));
    const ModelInfo& info = engine->info();

    // Every input line of the shard: parsed, or skipped when OUT already has it. Every line's id
    // is read (keys), so a repeated id is found wherever its first line is.
    std::vector<Item> items;
    batch::LineKeys keys;
    int64_t n_skipped = 0, n_failed_before = 0, total_tokens = 0;
    std::string text;
    for (int64_t line = 1; std::getline(in, text); ++line) {
      if (!text.empty() && text.back() == '\r') text.pop_back();
      if (batch::IsBlankLine(text)) continue;
      const json j = json::parse(text, nullptr, false);
      bool duplicate = false;
      const std::string key = keys.Add(j.is_discarded() ? json(nullptr) : batch::IdOfLine(j), line, &duplicate);
      if (!batch::InShard(shard, line - 1, j.is_discarded() ? json(nullptr) : batch::IdOfLine(j))) continue;
      if (done.count(key)) {
        ++n_skipped;
        n_failed_before += failed[key];
        continue;
      }
      Item it = Parse(j, line, info);
      it.by_line = key.rfind("line:", 0) == 0;
      if (duplicate && it.error.empty()) it.error = "duplicate id " + it.id.dump() + " (an earlier line has it)";
      total_tokens += it.error.empty() ? it.tokens : 0;
      items.push_back(std::move(it));
    }
    if (in.bad()) return Status::IOError(input_ + ": read failed");

    const int fd = open(output_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError(output_ + ": cannot open for writing: " + std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { close(fd); }
    } closer{fd};

    const bool progress = !no_progress_ && isatty(STDERR_FILENO);
    const int64_t window_tokens = 4 * engine->pass_tokens();
    int64_t n_failed = 0, n_ok = 0, tokens_done = 0;
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
        batch.push_back(std::move(items[i].req));
      }
      std::vector<Result<Response>> results = engine->RunBatch(batch);
      std::string out;
      for (size_t i = w0; i < w1; ++i) {
        Item& it = items[i];
        ojson o;
        if (slot[i - w0] < 0) {
          o = ErrorJson(it, it.error);
        } else {
          Result<Response>& r = results[slot[i - w0]];
          if (r.ok()) {
            it.req = std::move(batch[slot[i - w0]]);  // for ResultJson's flags
            o = ResultJson(it, *r);
          } else {
            o = ErrorJson(it, r.status().message());
          }
        }
        if (o.contains("error")) ++n_failed; else ++n_ok;
        out += o.dump(-1, ' ', false, ojson::error_handler_t::replace);
        out += '\n';
      }
      size_t off = 0;
      while (off < out.size()) {
        const ssize_t n = write(fd, out.data() + off, out.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::IOError(output_ + ": write failed: " + std::strerror(errno));
        off += static_cast<size_t>(n);
      }
      if (fsync(fd) != 0) return Status::IOError(output_ + ": fsync failed: " + std::strerror(errno));
      tokens_done += wt;
      w0 = w1;
      if (progress) {
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double tps = el > 0 ? tokens_done / el : 0;
        const double eta = tps > 0 ? (total_tokens - std::min(tokens_done, total_tokens)) / tps : 0;
        const int width = 30;
        const int fill = total_tokens > 0 ? static_cast<int>(width * std::min<double>(1, 1.0 * tokens_done / total_tokens)) : width;
        std::fprintf(stderr, "\r[%s%s] %zu/%zu lines  %.0f tok/s  ETA %.0f s   ", std::string(fill, '#').c_str(),
                     std::string(width - fill, '.').c_str(), w0, items.size(), tps, eta);
        std::fflush(stderr);
      }
    }
    if (progress) std::fprintf(stderr, "\n");
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string shard_text = shard_.empty() ? "" : "shard " + batch::ShardName(shard) + ": ";
    std::fprintf(stderr,
                 "estream score: %s%lld lines scored, %lld failed, %lld already in %s (%lld of them failed); "
                 "%lld tokens in %.2f s (%.1f tok/s); peak RSS %s\n",
                 shard_text.c_str(), static_cast<long long>(n_ok), static_cast<long long>(n_failed),
                 static_cast<long long>(n_skipped), output_.c_str(), static_cast<long long>(n_failed_before),
                 static_cast<long long>(tokens_done), wall, wall > 0 ? tokens_done / wall : 0.0,
                 FormatBytes(PeakRssBytes()).c_str());
    return n_failed + n_failed_before > 0 ? 1 : 0;
  }

  std::string model_, input_, output_;
  std::string shard_, shard_by_ = "line";
  std::vector<std::string> merge_;
  BatchEngineFlags flags_;
  bool no_progress_ = false;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(ScoreCommand, "score",
                         "Score a JSONL file of prompts in batches (next tokens, embeddings, candidate continuations); resumable");

}  // namespace estream::cli

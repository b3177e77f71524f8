#include "batch/eval.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <utility>

#include "base/format.h"
#include "base/json_text.h"
#include "tokenizer/tokenizer.h"

namespace estream::batch {
namespace {

// Common prefix length of the sequences (at most the shortest one's length).
int64_t CommonPrefix(const std::vector<std::vector<int32_t>>& seqs) {
  size_t min_len = seqs[0].size();
  for (const auto& s : seqs) min_len = std::min(min_len, s.size());
  size_t k = 0;
  while (k < min_len) {
    bool same = true;
    for (const auto& s : seqs) same = same && s[k] == seqs[0][k];
    if (!same) break;
    ++k;
  }
  return static_cast<int64_t>(k);
}

// The context of a task's request: the candidates' common prefix, at most all but one token of
// the shortest (every candidate keeps a token to score).
int64_t ContextTokens(const EvalTask& t) {
  size_t shortest = t.seqs[0].size();
  for (const auto& s : t.seqs) shortest = std::min(shortest, s.size());
  return std::min(CommonPrefix(t.seqs), static_cast<int64_t>(shortest) - 1);
}

// Winogrande: whether only the tokens after "first + choice" are scored (both sequences have more
// than 3 tokens after their common prefix; llama.cpp's skip_choice), else all after the prefix.
bool WinograndePartial(const EvalTask& t, int64_t cp) {
  constexpr int64_t kMinTrailing = 3;
  return static_cast<int64_t>(t.seqs[0].size()) - cp > kMinTrailing &&
         static_cast<int64_t>(t.seqs[1].size()) - cp > kMinTrailing;
}

// Loads the tasks of one file (the parsers of the three formats share the tokenizer, the
// subset rule and the messages).
class TaskLoader {
 public:
  TaskLoader(const Tokenizer& tok, const LoadTasksOptions& o) : tok_(tok), o_(o) {}

  Result<std::vector<EvalTask>> Hellaswag(std::string_view data) const {
    // As llama-perplexity reads it: its -f reader drops one final newline, then every line counts,
    // so a file ending with one blank line is accepted (two are a 73rd line: refused, as there).
    if (data.ends_with('\n')) data.remove_suffix(1);
    std::vector<std::string> lines;
    std::istringstream ss{std::string(data)};
    std::string line;
    while (std::getline(ss, line, '\n')) lines.push_back(line);
    if (lines.size() % 6 != 0)
      return Status::InvalidArgument(o_.name + ": " + std::to_string(lines.size()) +
                                     " lines, not a multiple of 6 (hellaswag: context, gold index, 4 endings)");
    size_t count = lines.size() / 6;
    if (o_.n_tasks > 0 && static_cast<size_t>(o_.n_tasks) < count) count = static_cast<size_t>(o_.n_tasks);
    // llama.cpp's order: a uniform pick among the tasks left, each removed once picked.
    std::vector<size_t> left(lines.size() / 6);
    for (size_t i = 0; i < left.size(); ++i) left[i] = i;
    std::mt19937 rng(1);
    std::vector<EvalTask> tasks;
    for (size_t i = 0; i < count; ++i) {
      std::uniform_int_distribution<size_t> dist(0, left.size() - 1);
      const size_t pick = dist(rng);
      const size_t idx = left[pick];
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(pick));
      EvalTask t;
      t.index = static_cast<int64_t>(idx);
      t.line = static_cast<int64_t>(idx * 6 + 1);
      const std::string& ctx = lines[idx * 6];
      char* end = nullptr;
      const long gold = std::strtol(lines[idx * 6 + 1].c_str(), &end, 10);
      if (end == lines[idx * 6 + 1].c_str() || gold < 0 || gold > 3)
        return Status::InvalidArgument(o_.name + ": line " + std::to_string(idx * 6 + 2) + ": gold ending '" +
                                       lines[idx * 6 + 1] + "' is not 0, 1, 2 or 3");
      for (int e = 0; e < 4; ++e) {
        t.seqs.push_back(Tok(ctx + " " + lines[idx * 6 + 2 + e]));
        t.labels.push_back(e == gold ? 1 : 0);
      }
      tasks.push_back(std::move(t));
    }
    return tasks;
  }

  Result<std::vector<EvalTask>> Winogrande(std::string_view data) const {
    // llama-perplexity never scores a winogrande file's last line: its -f reader drops one final
    // newline, and its CSV loop stops when a getline reaches the end of the text, before using
    // that line. Its figures are the reference (one task fewer than the file's lines), so the
    // same line is left out here, with a note.
    if (!data.empty() && data.back() == '\n') data.remove_suffix(1);
    const size_t last_newline = data.rfind('\n');
    const std::string_view dropped = last_newline == std::string_view::npos ? data : data.substr(last_newline + 1);
    const bool dropped_text = dropped.find_first_not_of(" \t\r") != std::string_view::npos;
    if (last_newline == std::string_view::npos && dropped_text)
      return Status::InvalidArgument(o_.name + ": no winogrande tasks: the file's only line is its last line, "
                                     "which llama-perplexity does not score (its reader stops at the end of the "
                                     "file before using the line); add a line after it: llama-perplexity "
                                     "scores every line but the last");
    data = last_newline == std::string_view::npos ? std::string_view() : data.substr(0, last_newline + 1);
    if (dropped_text && o_.warn)
      o_.warn("note: " + o_.name + ": the last line is not scored, as llama-perplexity does not score it (its "
              "reader stops at the end of the file before using the line)");
    std::vector<EvalTask> all;
    std::istringstream ss{std::string(data)};
    std::string line;
    int64_t line_no = 0;
    // Per-line warnings: the first kMaxLineWarnings, then how many more (a file of another
    // format, such as a hellaswag file, would give one per line: thousands).
    constexpr int64_t kMaxLineWarnings = 10;
    int64_t n_warnings = 0;
    auto warn_line = [&](const std::string& what) {
      if (++n_warnings <= kMaxLineWarnings && o_.warn)
        o_.warn("warning: " + o_.name + " line " + std::to_string(line_no) + ": " + what);
    };
    while (std::getline(ss, line)) {
      ++line_no;
      int comma[4], n = 0;
      bool quoted = false;
      for (int i = 0; i < static_cast<int>(line.size()) && n < 4; ++i) {
        if (line[i] == '"') quoted = !quoted;
        else if (line[i] == ',' && !quoted) comma[n++] = i;
      }
      auto skip = [&](const char* why) { warn_line(std::string(why) + "; skipped"); };
      if (n != 4) {
        skip("not 5 comma-separated fields");
        continue;
      }
      const std::string sentence = line[comma[0] + 1] == '"'
                                       ? line.substr(comma[0] + 2, comma[1] - comma[0] - 3)
                                       : line.substr(comma[0] + 1, comma[1] - comma[0] - 1);
      const std::string c1 = line.substr(comma[1] + 1, comma[2] - comma[1] - 1);
      const std::string c2 = line.substr(comma[2] + 1, comma[3] - comma[2] - 1);
      const size_t blank = sentence.find('_');
      if (blank == std::string::npos) {
        skip("no '_' in the sentence");
        continue;
      }
      std::istringstream as(line.substr(comma[3] + 1));
      int answer = 0;
      as >> answer;
      if (as.fail() || answer < 1 || answer > 2) {
        skip("the answer is not 1 or 2");
        continue;
      }
      const std::string first = sentence.substr(0, blank), second = sentence.substr(blank + 1);
      EvalTask t;
      t.index = static_cast<int64_t>(all.size());
      t.line = line_no;
      for (const std::string* c : {&c1, &c2}) {
        t.seqs.push_back(Tok(first + *c + second));
        t.n_base.push_back(static_cast<int64_t>(Tok(first + *c).size()));
      }
      t.labels = {answer == 1 ? 1 : 0, answer == 2 ? 1 : 0};
      // A '_' that ends the sentence leaves nothing after the choice: partial scoring then
      // averages over no tokens, both scores are NaN and choice 2 wins (NaN > NaN is false).
      // llama-perplexity does the same, so the verdict is kept, with a warning.
      if (WinograndePartial(t, ContextTokens(t)) &&
          (t.n_base[0] >= static_cast<int64_t>(t.seqs[0].size()) ||
           t.n_base[1] >= static_cast<int64_t>(t.seqs[1].size())))
        warn_line("nothing follows the choices (the '_' ends the sentence), so no token is scored: the scores are "
                  "NaN and choice 2 is picked, as llama-perplexity picks it");
      all.push_back(std::move(t));
    }
    if (n_warnings > kMaxLineWarnings && o_.warn)
      o_.warn("warning: " + o_.name + ": " + std::to_string(n_warnings - kMaxLineWarnings) +
              " more lines warned about as above (not shown)");
    std::vector<EvalTask> out;
    for (size_t i : SubsetOrder(all.size())) out.push_back(std::move(all[i]));
    return out;
  }

  Result<std::vector<EvalTask>> MultipleChoice(std::string_view data) const {
    size_t pos = 0;
    auto u32 = [&](uint32_t* v) {
      if (pos + 4 > data.size()) return false;
      std::memcpy(v, data.data() + pos, 4);
      pos += 4;
      return true;
    };
    auto str = [&](std::string* s) {
      uint32_t n;
      if (!u32(&n) || pos + n > data.size()) return false;
      s->assign(data.data() + pos, n);
      pos += n;
      return true;
    };
    struct Answers {
      std::vector<std::string> text;
      std::vector<int32_t> labels;
    };
    // One answer set; "" when read, else what is wrong with it (after "task I ").
    constexpr uint32_t kMaxAnswers = 100;  // llama-perplexity's limit: it refuses larger sets
    auto answers = [&](const char* which, Answers* a) -> std::string {
      uint32_t n;
      if (!u32(&n)) return "is truncated or malformed";
      if (n > kMaxAnswers)
        return "has " + std::to_string(n) + " " + which + " answers, more than the " + std::to_string(kMaxAnswers) +
               " llama-perplexity reads";
      a->text.resize(n);
      for (std::string& s : a->text)
        if (!str(&s)) return "is truncated or malformed";
      a->labels.resize(n);
      if (pos + 4ull * n > data.size()) return "is truncated or malformed";
      if (n > 0) std::memcpy(a->labels.data(), data.data() + pos, 4ull * n);
      pos += 4ull * n;
      return "";
    };
    const std::string& name = o_.name;
    uint32_t n_task = 0;
    if (!u32(&n_task) || n_task == 0) return Status::InvalidArgument(name + ": no tasks (multiple-choice binary)");
    if (4ull * n_task > data.size() - pos)  // before allocating: a corrupt count would ask for up to 16 GiB
      return Status::InvalidArgument(name + ": " + std::to_string(n_task) + " tasks do not fit in " +
                                     std::to_string(data.size()) + " bytes (truncated or not a multiple-choice file)");
    std::vector<uint32_t> offsets(n_task);
    for (uint32_t& o : offsets)
      if (!u32(&o)) return Status::InvalidArgument(name + ": truncated task offset table");
    std::vector<EvalTask> tasks;
    bool warned_utf8 = false;
    for (size_t i : SubsetOrder(n_task)) {
      const std::string task = name + ": task " + std::to_string(i);
      if (o_.n_tasks > 0 && static_cast<size_t>(o_.n_tasks) < n_task) {  // random subset: seek
        if (offsets[i] >= data.size())
          return Status::InvalidArgument(task + "'s offset " + std::to_string(offsets[i]) + " is past the end of " +
                                         "the file (" + std::to_string(data.size()) + " bytes)");
        pos = offsets[i];
      }
      std::string question;
      Answers mc1, mc2;
      std::string why = str(&question) ? answers("mc1", &mc1) : "is truncated or malformed";
      if (why.empty()) why = answers("mc2", &mc2);
      if (!why.empty()) return Status::InvalidArgument(task + " " + why);
      if (question.empty() || mc1.text.empty())
        return Status::InvalidArgument(task + " has an empty question or no answers");
      if (!warned_utf8 && o_.warn) {
        bool valid = Tokenizer::IsValidUtf8(question);
        for (const std::string& a : mc1.text) valid = valid && Tokenizer::IsValidUtf8(a);
        if (!valid)
          o_.warn("warning: " + task + " is not valid UTF-8; each ill-formed sequence is tokenized as U+FFFD "
                  "(other such tasks are not reported)");
        warned_utf8 = !valid;
      }
      EvalTask t;
      t.index = static_cast<int64_t>(i);
      for (size_t a = 0; a < mc1.text.size(); ++a) {
        if (mc1.text[a].empty()) return Status::InvalidArgument(task + " has an empty answer");
        t.seqs.push_back(Tok(question + " " + mc1.text[a]));
        t.labels.push_back(mc1.labels[a]);
      }
      tasks.push_back(std::move(t));
    }
    return tasks;
  }

 private:
  std::vector<int32_t> Tok(const std::string& text) const { return tok_.Encode(text, true, false); }

  // llama.cpp's random subset of N tasks (winogrande and multiple-choice).
  std::vector<size_t> SubsetOrder(size_t n) const {
    std::vector<size_t> order;
    if (o_.n_tasks <= 0 || static_cast<size_t>(o_.n_tasks) >= n) {
      for (size_t i = 0; i < n; ++i) order.push_back(i);
      return order;
    }
    std::mt19937 rng(1);
    std::vector<size_t> aux(n);
    for (size_t i = 0; i < n; ++i) aux[i] = i;
    const float scale = 1.f / (1.f + static_cast<float>(std::mt19937::max()));
    for (int64_t i = 0; i < o_.n_tasks; ++i) {
      const size_t j = static_cast<size_t>(scale * static_cast<float>(rng()) * static_cast<float>(aux.size()));
      order.push_back(aux[j]);
      aux[j] = aux.back();
      aux.pop_back();
    }
    return order;
  }

  const Tokenizer& tok_;
  const LoadTasksOptions& o_;
};

int64_t RequestTokens(const Request& r) {
  int64_t n = static_cast<int64_t>(r.tokens.size());
  for (const auto& c : r.continuations) n += static_cast<int64_t>(c.size());
  return n;
}

// The request of a task: context = the first cp tokens, one continuation per candidate.
Request MakeRequest(EvalKind kind, const EvalTask& t, int64_t cp) {
  Request r;
  r.top_k = 0;
  r.tokens.assign(t.seqs[0].begin(), t.seqs[0].begin() + cp);
  for (const auto& s : t.seqs) r.continuations.emplace_back(s.begin() + cp, s.end());
  // Winogrande's partial scoring may start inside the common prefix.
  for (size_t i = 0; i < t.n_base.size(); ++i) r.prompt_logprobs = r.prompt_logprobs || t.n_base[i] < cp;
  // When the choice words are scored, llama-perplexity scores choice 2's first token with the
  // logits after the whole of sequence 1 (the row it reads is sequence 1's last; its "FIXME").
  // Its figures are the reference, so that log-probability is taken here too: sequence 1's
  // continuation gets choice 2's first token appended (causal: its other log-probabilities are
  // unchanged).
  if (kind == EvalKind::kWinogrande && !WinograndePartial(t, cp)) r.continuations[0].push_back(t.seqs[1][cp]);
  return r;
}

void ScoreTask(EvalKind kind, const EvalTask& t, int64_t cp, const Response& r, EvalItem* item) {
  const size_t n = t.seqs.size();
  item->scores.assign(n, 0);
  if (kind == EvalKind::kWinogrande) {
    const bool partial = WinograndePartial(t, cp);
    for (size_t s = 0; s < 2; ++s) {
      const int64_t len = static_cast<int64_t>(t.seqs[s].size());
      const int64_t base = partial ? t.n_base[s] : cp;
      const int64_t last = len - base > 1 ? 1 : 0;
      float sum = 0;  // llama.cpp sums in float
      for (int64_t p = std::max<int64_t>(base, 1); p < len - last; ++p)
        sum += p < cp                       ? r.prompt_logprobs[p - 1]
               : s == 1 && !partial && p == cp ? r.continuations[0].logprobs.back()  // (MakeRequest)
                                             : r.continuations[s].logprobs[p - cp];
      item->scores[s] = sum / static_cast<float>(len - base - last);
    }
    item->predicted = item->scores[0] > item->scores[1] ? 0 : 1;
  } else {
    for (size_t s = 0; s < n; ++s) {
      const ContinuationScore& c = r.continuations[s];
      item->scores[s] = c.log_likelihood / static_cast<double>(c.logprobs.size());
    }
    item->predicted = 0;
    for (size_t s = 1; s < n; ++s)
      if (item->scores[s] > item->scores[item->predicted]) item->predicted = static_cast<int>(s);
  }
  for (size_t s = 0; s < t.labels.size() && item->gold < 0; ++s)
    if (t.labels[s] == 1) item->gold = static_cast<int>(s);
  item->correct = t.labels[item->predicted] == 1;
}

}  // namespace

const char* EvalKindName(EvalKind kind) {
  switch (kind) {
    case EvalKind::kHellaswag: return "hellaswag";
    case EvalKind::kWinogrande: return "winogrande";
    case EvalKind::kMultipleChoice: return "multiple-choice";
  }
  return "?";
}

Result<EvalKind> ParseEvalKind(std::string_view name) {
  for (EvalKind k : {EvalKind::kHellaswag, EvalKind::kWinogrande, EvalKind::kMultipleChoice})
    if (name == EvalKindName(k)) return k;
  return Status::InvalidArgument("eval task '" + std::string(name) + "': use hellaswag, winogrande or multiple-choice");
}

Result<std::vector<EvalTask>> LoadTasks(EvalKind kind, std::string_view data, const Tokenizer& tokenizer,
                                        const LoadTasksOptions& options) {
  // As perplexity and tokenize warn (multiple-choice files are binary: their loader checks the
  // text of each task).
  size_t bad = 0;
  if (kind != EvalKind::kMultipleChoice && options.warn && !Tokenizer::IsValidUtf8(data, &bad))
    options.warn("warning: " + options.name + " is not valid UTF-8 (first bad byte at offset " + std::to_string(bad) +
                 "); each ill-formed sequence is tokenized as U+FFFD");
  const TaskLoader loader(tokenizer, options);
  Result<std::vector<EvalTask>> tasks = Status::InvalidArgument("unknown eval task kind");
  switch (kind) {
    case EvalKind::kHellaswag: tasks = loader.Hellaswag(data); break;
    case EvalKind::kWinogrande: tasks = loader.Winogrande(data); break;
    case EvalKind::kMultipleChoice: tasks = loader.MultipleChoice(data); break;
  }
  if (tasks.ok() && tasks->empty())
    return Status::InvalidArgument(options.name + ": no " + EvalKindName(kind) + " tasks in the file");
  return tasks;
}

Result<EvalResult> Evaluate(Engine& engine, EvalKind kind, const std::vector<EvalTask>& tasks,
                            const EvalOptions& options) {
  EvalResult res;
  res.kind = kind;
  res.items.resize(tasks.size());
  // Each task's context (the candidates' common prefix) and request length; 0: it cannot run.
  std::vector<int64_t> cps(tasks.size()), lengths(tasks.size(), 0);
  EvalProgress progress{.tasks_total = static_cast<int64_t>(tasks.size())};
  for (size_t i = 0; i < tasks.size(); ++i) {
    res.items[i].index = tasks[i].index;
    res.items[i].line = tasks[i].line;
    cps[i] = ContextTokens(tasks[i]);
    if (cps[i] < 1) {
      res.items[i].error = "the candidates share no first token (the vocabulary adds no BOS): nothing to condition on";
      continue;
    }
    lengths[i] = RequestTokens(MakeRequest(kind, tasks[i], cps[i]));
    progress.tokens_total += lengths[i];
  }
  // Windows of tasks, ~4 passes each; the engine packs each window into passes.
  const int64_t pass = options.pass_tokens > 0 ? std::min(options.pass_tokens, engine.pass_tokens())
                                               : engine.pass_tokens();
  for (size_t w0 = 0; w0 < tasks.size();) {
    std::vector<Request> batch;
    std::vector<size_t> which;
    int64_t wt = 0;
    size_t w1 = w0;
    for (; w1 < tasks.size(); ++w1) {
      if (lengths[w1] == 0) continue;
      if (!batch.empty() && wt + lengths[w1] > 4 * pass) break;
      wt += lengths[w1];
      batch.push_back(MakeRequest(kind, tasks[w1], cps[w1]));
      which.push_back(w1);
    }
    std::vector<Result<Response>> out = engine.RunBatch(batch, options.pass_tokens);
    std::set<int> seen_pass;  // passes are packed longest first: not in request order
    for (size_t i = 0; i < out.size(); ++i) {
      EvalItem& item = res.items[which[i]];
      if (!out[i].ok()) {
        item.error = out[i].status().message();
        continue;
      }
      ScoreTask(kind, tasks[which[i]], cps[which[i]], *out[i], &item);
      for (const auto& seq : tasks[which[i]].seqs) res.tokens_separate += static_cast<int64_t>(seq.size());
      if (seen_pass.insert(out[i]->pass).second) {  // each pass of the window once
        res.forward_seconds += out[i]->seconds;
        res.tokens += out[i]->pass_tokens;
        ++res.passes;
        res.longest_pass = std::max(res.longest_pass, out[i]->pass_tokens);
      }
    }
    w0 = w1;
    progress.tasks_done = static_cast<int64_t>(w1);
    progress.tokens_done += wt;
    if (options.progress) options.progress(progress);
  }

  for (size_t i = 0; i < tasks.size(); ++i) {
    const EvalItem& item = res.items[i];
    if (!item.error.empty()) {
      ++res.n_failed;
      continue;
    }
    ++res.n_tasks;
    res.n_answers += static_cast<int64_t>(tasks[i].seqs.size());
    res.n_correct += item.correct;
  }
  // No task scored: nothing is defined (NaN, not a 0% that reads as a result); one task: the
  // standard error's n - 1 is 0.
  const int64_t n = res.n_tasks;
  if (n == 0) return res;
  const double p = static_cast<double>(res.n_correct) / n;
  res.accuracy = p;
  if (n > 1) res.standard_error = std::sqrt(p * (1 - p) / (n - 1));
  // Wilson score interval at 95% (llama.cpp's hellaswag output).
  const double za = 1.95996398454, z = za * za / n;
  const double cnf = z * std::sqrt(n * (4.0 * p * (1 - p) + z)) / (za + za);
  res.wilson_lo = (p + z * 0.5 - cnf) / (1.0 + z);
  res.wilson_hi = (p + z * 0.5 + cnf) / (1.0 + z);
  return res;
}

std::string EvalJson(const EvalResult& r) {
  nlohmann::ordered_json j;
  j["task"] = EvalKindName(r.kind);
  j["model"] = r.model;
  j["file"] = r.file;
  j["n_tasks"] = r.n_tasks;
  j["n_failed"] = r.n_failed;
  j["n_correct"] = r.n_correct;
  // Undefined figures (NaN: no task scored, or the standard error of one task) are null.
  auto percent = [](double x) { return std::isnan(x) ? nlohmann::ordered_json() : nlohmann::ordered_json(100 * x); };
  j["accuracy"] = percent(r.accuracy);
  j["stderr"] = percent(r.standard_error);
  j["wilson95"] =
      r.n_tasks > 0 ? nlohmann::ordered_json{100 * r.wilson_lo, 100 * r.wilson_hi} : nlohmann::ordered_json();
  j["random_chance"] = percent(r.random_chance());
  j["tokens"] = r.tokens;
  j["passes"] = r.passes;
  j["longest_pass"] = r.longest_pass;
  j["tokens_separate"] = r.tokens_separate;
  j["forward_seconds"] = r.forward_seconds;
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  for (const EvalItem& t : r.items) {
    nlohmann::ordered_json it;
    it["index"] = t.index;
    if (t.line > 0) it["line"] = t.line;
    if (!t.error.empty()) {
      it["error"] = t.error;
    } else {
      it["gold"] = t.gold;
      it["scores"] = t.scores;
      it["predicted"] = t.predicted;
      it["correct"] = t.correct;
    }
    items.push_back(std::move(it));
  }
  j["items"] = std::move(items);
  return DumpJson(j, 2);
}

std::string EvalText(const EvalResult& r) {
  std::string s;
  if (r.n_tasks == 0) {
    Appendf(&s, "%s: no task was scored: all %lld failed (see stderr)\n", EvalKindName(r.kind),
            static_cast<long long>(r.n_failed));
    return s;
  }
  Appendf(&s, "%s: %lld tasks, accuracy %.4f%% +/- ", EvalKindName(r.kind), static_cast<long long>(r.n_tasks),
          100 * r.accuracy);
  if (std::isnan(r.standard_error)) s += "undefined (one task)";
  else Appendf(&s, "%.4f", 100 * r.standard_error);
  if (r.kind == EvalKind::kHellaswag)
    Appendf(&s, "  (95%% Wilson interval [%.4f%%, %.4f%%])", 100 * r.wilson_lo, 100 * r.wilson_hi);
  s += "\n";
  Appendf(&s, "random chance: %.4f%%\n", 100 * r.random_chance());
  Appendf(&s,
          "forward passes: %lld tokens in %lld passes of up to %lld (%lld if every candidate were run separately) "
          "in %.3f s, %.1f tok/s\n",
          static_cast<long long>(r.tokens), static_cast<long long>(r.passes), static_cast<long long>(r.longest_pass),
          static_cast<long long>(r.tokens_separate), r.forward_seconds,
          r.forward_seconds > 0 ? r.tokens / r.forward_seconds : 0.0);
  if (r.n_failed > 0) Appendf(&s, "failed: %lld tasks (see stderr)\n", static_cast<long long>(r.n_failed));
  return s;
}

}  // namespace estream::batch

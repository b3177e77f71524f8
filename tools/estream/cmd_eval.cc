// estream eval: multiple-choice benchmarks from the files llama.cpp's llama-perplexity reads
// (--hellaswag, --winogrande, --multiple-choice), scored with shared-prefix candidates.
//
//   estream eval --task hellaswag|winogrande|multiple-choice -m MODEL FILE [--tasks N] [--json]
//
// Every task becomes one Request: the tokens its candidate sequences share (the common prefix of
// their token ids) are the context, computed once; each candidate's remaining tokens are one
// continuation (Engine::RunBatch packs many tasks per pass). The scoring follows llama.cpp's
// (tools/perplexity/perplexity.cpp):
//  - hellaswag: text file, 6 lines per task: context, gold ending index (0-3), 4 endings.
//    Sequence i = tokenize(context + " " + ending[i]) with the vocabulary's BOS. Score of an ending =
//    mean log-probability of its tokens after the common prefix (acc_norm by token count); the
//    largest score wins (the first on ties). Tasks are taken in llama.cpp's random order
//    (std::mt19937 seeded 1, one uniform pick per task among those left), --tasks N keeping the first N.
//  - winogrande: CSV lines "index,sentence,choice1,choice2,answer" (answer 1 or 2; the sentence
//    has a "_", may be double-quoted; lines that do not parse are skipped with a warning).
//    Sequence i = tokenize(first + choice_i + second). When both sequences have more than 3 tokens
//    after their common prefix, only the tokens after "first + choice_i" are scored (partial
//    scoring), else all tokens after the common prefix; the last token is left out when more than
//    one remains; score = mean log-probability; choice 1 wins only if its score is larger.
//    Known difference: when the choice words are scored (short tails), llama.cpp takes the first
//    logits of choice 2 from the wrong row (its "FIXME"); estream uses the right ones.
//  - multiple-choice: llama.cpp's binary format: u32 n_tasks, u32 offsets[n_tasks], then per task
//    a string question and two answer sets (mc1, mc2), each u32 n (<= 100), n strings and n int32
//    labels; strings are u32 length + bytes. Sequence i = tokenize(question + " " + answer_i) of
//    mc1; score = mean log-probability after the common prefix; correct when the best answer's
//    label is 1. --tasks N picks N tasks at random as llama.cpp does.
// Accuracy is reported with its standard error sqrt(p (1 - p) / (n - 1)) (llama.cpp's "+/-"),
// and for hellaswag also the 95% Wilson interval llama.cpp prints. Log-probabilities are those of
// Engine (double log-sum-exp); llama.cpp's differ by float rounding, so only near-tied candidates
// could rank differently.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/batch_options.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

// One multiple-choice item, tokenized.
struct Task {
  int64_t index = 0;                       // position in the file (task number, 0-based)
  std::vector<std::vector<int32_t>> seqs;  // one token sequence per candidate
  std::vector<int> labels;                 // 1 = correct (hellaswag/winogrande: one 1)
  std::vector<int64_t> n_base;             // winogrande: tokens of first + choice_i
  // Filled by scoring:
  std::vector<double> scores;
  int predicted = -1;
  std::string error;
};

// Common prefix length of the sequences, at most min length - 1 (every candidate keeps at least
// one token to score).
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

class EvalCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("--task", task_, "hellaswag, winogrande or multiple-choice")
        ->required()
        ->check(CLI::IsMember({"hellaswag", "winogrande", "multiple-choice"}));
    sub->add_option("-m,--model", model_, "GGUF model file with a tokenizer (packed for --budget)")->required();
    sub->add_option("file", file_, "task file, as read by llama-perplexity --hellaswag / --winogrande / "
                    "--multiple-choice")->required();
    sub->add_option("--tasks", n_tasks_, "use N tasks, chosen as llama-perplexity's --hellaswag-tasks / "
                    "--winogrande-tasks / --multiple-choice-tasks choose them (default: all)")
        ->check(CLI::PositiveNumber);
    sub->add_flag("--json", json_, "print one JSON object with the accuracy and every item's scores");
    flags_.Setup(sub);
  }

 private:
  std::vector<int32_t> Tok(const std::string& text) const { return tok_->Encode(text, true, false); }

  Result<std::vector<Task>> LoadHellaswag(const std::string& data) const {
    std::vector<std::string> lines;
    std::istringstream ss(data);
    std::string line;
    while (std::getline(ss, line, '\n')) lines.push_back(line);
    if (lines.size() % 6 != 0)
      return Status::InvalidArgument(file_ + ": " + std::to_string(lines.size()) +
                                     " lines, not a multiple of 6 (hellaswag: context, gold index, 4 endings)");
    size_t count = lines.size() / 6;
    if (n_tasks_ > 0 && static_cast<size_t>(n_tasks_) < count) count = static_cast<size_t>(n_tasks_);
    // llama.cpp's order: a uniform pick among the tasks left, each removed once picked.
    std::vector<size_t> left(lines.size() / 6);
    for (size_t i = 0; i < left.size(); ++i) left[i] = i;
    std::mt19937 rng(1);
    std::vector<Task> tasks;
    for (size_t i = 0; i < count; ++i) {
      std::uniform_int_distribution<size_t> dist(0, left.size() - 1);
      const size_t pick = dist(rng);
      const size_t idx = left[pick];
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(pick));
      Task t;
      t.index = static_cast<int64_t>(idx);
      const std::string& ctx = lines[idx * 6];
      char* end = nullptr;
      const long gold = std::strtol(lines[idx * 6 + 1].c_str(), &end, 10);
      if (end == lines[idx * 6 + 1].c_str() || gold < 0 || gold > 3)
        return Status::InvalidArgument(file_ + ": line " + std::to_string(idx * 6 + 2) + ": gold ending '" +
                                       lines[idx * 6 + 1] + "' is not 0, 1, 2 or 3");
      for (int e = 0; e < 4; ++e) {
        t.seqs.push_back(Tok(ctx + " " + lines[idx * 6 + 2 + e]));
        t.labels.push_back(e == gold ? 1 : 0);
      }
      tasks.push_back(std::move(t));
    }
    return tasks;
  }

  Result<std::vector<Task>> LoadWinogrande(const std::string& data) const {
    std::vector<Task> all;
    std::istringstream ss(data);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(ss, line)) {
      ++line_no;
      int comma[4], n = 0;
      bool quoted = false;
      for (int i = 0; i < static_cast<int>(line.size()) && n < 4; ++i) {
        if (line[i] == '"') quoted = !quoted;
        else if (line[i] == ',' && !quoted) comma[n++] = i;
      }
      auto skip = [&](const char* why) {
        std::fprintf(stderr, "estream eval: warning: %s line %lld: %s; skipped\n", file_.c_str(),
                     static_cast<long long>(line_no), why);
      };
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
      Task t;
      t.index = static_cast<int64_t>(all.size());
      for (const std::string* c : {&c1, &c2}) {
        t.seqs.push_back(Tok(first + *c + second));
        t.n_base.push_back(static_cast<int64_t>(Tok(first + *c).size()));
      }
      t.labels = {answer == 1 ? 1 : 0, answer == 2 ? 1 : 0};
      all.push_back(std::move(t));
    }
    if (all.empty()) return Status::InvalidArgument(file_ + ": no winogrande tasks");
    return Subset(std::move(all));
  }

  // llama.cpp's random subset of N tasks (winogrande and multiple-choice).
  std::vector<size_t> SubsetOrder(size_t n) const {
    std::vector<size_t> order;
    if (n_tasks_ <= 0 || static_cast<size_t>(n_tasks_) >= n) {
      for (size_t i = 0; i < n; ++i) order.push_back(i);
      return order;
    }
    std::mt19937 rng(1);
    std::vector<size_t> aux(n);
    for (size_t i = 0; i < n; ++i) aux[i] = i;
    const float scale = 1.f / (1.f + static_cast<float>(std::mt19937::max()));
    for (int64_t i = 0; i < n_tasks_; ++i) {
      const size_t j = static_cast<size_t>(scale * static_cast<float>(rng()) * static_cast<float>(aux.size()));
      order.push_back(aux[j]);
      aux[j] = aux.back();
      aux.pop_back();
    }
    return order;
  }

  std::vector<Task> Subset(std::vector<Task> all) const {
    std::vector<Task> out;
    for (size_t i : SubsetOrder(all.size())) out.push_back(std::move(all[i]));
    return out;
  }

  Result<std::vector<Task>> LoadMultipleChoice(const std::string& data) const {
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
    auto answers = [&](Answers* a) {
      uint32_t n;
      if (!u32(&n) || n > 100) return false;
      a->text.resize(n);
      for (std::string& s : a->text)
        if (!str(&s)) return false;
      a->labels.resize(n);
      if (pos + 4ull * n > data.size()) return false;
      std::memcpy(a->labels.data(), data.data() + pos, 4ull * n);
      pos += 4ull * n;
      return true;
    };
    uint32_t n_task = 0;
    if (!u32(&n_task) || n_task == 0) return Status::InvalidArgument(file_ + ": no tasks (multiple-choice binary)");
    std::vector<uint32_t> offsets(n_task);
    for (uint32_t& o : offsets)
      if (!u32(&o)) return Status::InvalidArgument(file_ + ": truncated task offset table");
    std::vector<Task> tasks;
    for (size_t i : SubsetOrder(n_task)) {
      if (n_tasks_ > 0 && static_cast<size_t>(n_tasks_) < n_task) pos = offsets[i];  // random subset: seek
      std::string question;
      Answers mc1, mc2;
      if (!str(&question) || !answers(&mc1) || !answers(&mc2))
        return Status::InvalidArgument(file_ + ": task " + std::to_string(i) + " is truncated or malformed");
      if (question.empty() || mc1.text.empty())
        return Status::InvalidArgument(file_ + ": task " + std::to_string(i) + " has an empty question or no answers");
      Task t;
      t.index = static_cast<int64_t>(i);
      for (size_t a = 0; a < mc1.text.size(); ++a) {
        if (mc1.text[a].empty())
          return Status::InvalidArgument(file_ + ": task " + std::to_string(i) + " has an empty answer");
        t.seqs.push_back(Tok(question + " " + mc1.text[a]));
        t.labels.push_back(mc1.labels[a]);
      }
      tasks.push_back(std::move(t));
    }
    return tasks;
  }

  // The request of a task: context = common prefix, one continuation per candidate.
  Request MakeRequest(const Task& t, int64_t cp) const {
    Request r;
    r.top_k = 0;
    r.tokens.assign(t.seqs[0].begin(), t.seqs[0].begin() + cp);
    for (const auto& s : t.seqs) r.continuations.emplace_back(s.begin() + cp, s.end());
    // Winogrande's partial scoring may start inside the common prefix.
    for (size_t i = 0; i < t.n_base.size(); ++i) r.prompt_logprobs = r.prompt_logprobs || t.n_base[i] < cp;
    return r;
  }

  void ScoreTask(Task* t, int64_t cp, const Response& r) const {
    const size_t n = t->seqs.size();
    t->scores.assign(n, 0);
    if (task_ == "winogrande") {
      constexpr int64_t kMinTrailing = 3;
      const bool partial = static_cast<int64_t>(t->seqs[0].size()) - cp > kMinTrailing &&
                           static_cast<int64_t>(t->seqs[1].size()) - cp > kMinTrailing;
      for (size_t s = 0; s < 2; ++s) {
        const int64_t len = static_cast<int64_t>(t->seqs[s].size());
        const int64_t base = partial ? t->n_base[s] : cp;
        const int64_t last = len - base > 1 ? 1 : 0;
        float sum = 0;  // llama.cpp sums in float
        for (int64_t p = std::max<int64_t>(base, 1); p < len - last; ++p)
          sum += p >= cp ? r.continuations[s].logprobs[p - cp] : r.prompt_logprobs[p - 1];
        t->scores[s] = sum / static_cast<float>(len - base - last);
      }
      t->predicted = t->scores[0] > t->scores[1] ? 0 : 1;
      return;
    }
    for (size_t s = 0; s < n; ++s) {
      const ContinuationScore& c = r.continuations[s];
      t->scores[s] = c.log_likelihood / static_cast<double>(c.logprobs.size());
    }
    t->predicted = 0;
    for (size_t s = 1; s < n; ++s)
      if (t->scores[s] > t->scores[t->predicted]) t->predicted = static_cast<int>(s);
  }

  Result<int> Run() override {
    ESTREAM_ASSIGN_OR_RETURN(std::string data, ReadFileText(file_));
    {
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_, {.mmap = false}));
      auto t = Tokenizer::FromGguf(*gguf);
      if (!t.ok()) return Status(t.status().code(), t.status().message() + " (eval needs the model's tokenizer)");
      tok_ = std::move(t).value();
    }
    std::vector<Task> tasks;
    if (task_ == "hellaswag") {
      ESTREAM_ASSIGN_OR_RETURN(tasks, LoadHellaswag(data));
    } else if (task_ == "winogrande") {
      ESTREAM_ASSIGN_OR_RETURN(tasks, LoadWinogrande(data));
    } else {
      ESTREAM_ASSIGN_OR_RETURN(tasks, LoadMultipleChoice(data));
    }
    ESTREAM_ASSIGN_OR_RETURN(EngineOptions eo, flags_.Options());
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, eo));

    // Windows of tasks, ~4 passes each; the engine packs each window into passes.
    const int64_t window = 4 * engine->pass_tokens();
    double seconds = 0;
    int64_t tokens = 0, separate_tokens = 0;
    for (size_t w0 = 0; w0 < tasks.size();) {
      std::vector<Request> batch;
      std::vector<int64_t> cps;
      std::vector<size_t> which;
      int64_t wt = 0;
      size_t w1 = w0;
      for (; w1 < tasks.size(); ++w1) {
        Task& t = tasks[w1];
        const int64_t cp = std::min<int64_t>(CommonPrefix(t.seqs), static_cast<int64_t>(
                                             std::min_element(t.seqs.begin(), t.seqs.end(), [](auto& a, auto& b) {
                                               return a.size() < b.size();
                                             })->size()) - 1);
        if (cp < 1) {
          t.error = "the candidates share no first token (the vocabulary adds no BOS): nothing to condition on";
          continue;
        }
        Request r = MakeRequest(t, cp);
        int64_t n = static_cast<int64_t>(r.tokens.size());
        for (const auto& c : r.continuations) n += static_cast<int64_t>(c.size());
        if (!batch.empty() && wt + n > window) break;
        wt += n;
        for (const auto& s : t.seqs) separate_tokens += static_cast<int64_t>(s.size());
        batch.push_back(std::move(r));
        cps.push_back(cp);
        which.push_back(w1);
      }
      std::vector<Result<Response>> res = engine->RunBatch(batch);
      int last_pass = -1;
      for (size_t i = 0; i < res.size(); ++i) {
        Task& t = tasks[which[i]];
        if (!res[i].ok()) {
          t.error = res[i].status().message();
          continue;
        }
        ScoreTask(&t, cps[i], *res[i]);
        if (res[i]->pass != last_pass) {  // passes of one window are listed once each
          seconds += res[i]->seconds;
          tokens += res[i]->pass_tokens;
          last_pass = res[i]->pass;
        }
      }
      w0 = w1;
    }

    int64_t n_done = 0, n_correct = 0, n_answers = 0, n_failed = 0;
    for (const Task& t : tasks) {
      if (!t.error.empty()) {
        ++n_failed;
        std::fprintf(stderr, "estream eval: task %lld: %s\n", static_cast<long long>(t.index), t.error.c_str());
        continue;
      }
      ++n_done;
      n_answers += static_cast<int64_t>(t.seqs.size());
      n_correct += t.labels[t.predicted] == 1;
    }
    const double p = n_done > 0 ? static_cast<double>(n_correct) / n_done : 0;
    const double se = n_done > 1 ? std::sqrt(p * (1 - p) / (n_done - 1)) : 0;
    // Wilson score interval at 95% (llama.cpp's hellaswag output).
    const double za = 1.95996398454, z = n_done > 0 ? za * za / n_done : 0;
    const double cnf = n_done > 0 ? z * std::sqrt(n_done * (4.0 * p * (1 - p) + z)) / (za + za) : 0;
    const double lo = (p + z * 0.5 - cnf) / (1.0 + z), hi = (p + z * 0.5 + cnf) / (1.0 + z);

    if (json_) {
      nlohmann::ordered_json j;
      j["task"] = task_;
      j["model"] = model_;
      j["file"] = file_;
      j["n_tasks"] = n_done;
      j["n_failed"] = n_failed;
      j["n_correct"] = n_correct;
      j["accuracy"] = 100 * p;
      j["stderr"] = 100 * se;
      j["wilson95"] = {100 * lo, 100 * hi};
      j["random_chance"] = n_answers > 0 ? 100.0 * n_done / n_answers : 0;
      j["tokens"] = tokens;
      j["tokens_separate"] = separate_tokens;
      j["forward_seconds"] = seconds;
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (const Task& t : tasks) {
        nlohmann::ordered_json it;
        it["index"] = t.index;
        if (!t.error.empty()) {
          it["error"] = t.error;
        } else {
          int gold = -1;
          for (size_t s = 0; s < t.labels.size() && gold < 0; ++s)
            if (t.labels[s] == 1) gold = static_cast<int>(s);
          it["gold"] = gold;
          it["scores"] = t.scores;
          it["predicted"] = t.predicted;
          it["correct"] = t.labels[t.predicted] == 1;
        }
        items.push_back(std::move(it));
      }
      j["items"] = std::move(items);
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s: %lld tasks, accuracy %.4f%% +/- %.4f", task_.c_str(), static_cast<long long>(n_done), 100 * p,
                  100 * se);
      if (task_ == "hellaswag") std::printf("  (95%% Wilson interval [%.4f%%, %.4f%%])", 100 * lo, 100 * hi);
      std::printf("\n");
      std::printf("random chance: %.4f%%\n", n_answers > 0 ? 100.0 * n_done / n_answers : 0.0);
      std::printf("forward passes: %lld tokens (%lld if every candidate were run separately) in %.3f s, %.1f tok/s\n",
                  static_cast<long long>(tokens), static_cast<long long>(separate_tokens), seconds,
                  seconds > 0 ? tokens / seconds : 0.0);
      if (n_failed > 0) std::printf("failed: %lld tasks (see stderr)\n", static_cast<long long>(n_failed));
    }
    return n_failed > 0 ? 1 : 0;
  }

  std::string task_, model_, file_;
  int64_t n_tasks_ = 0;
  bool json_ = false;
  BatchEngineFlags flags_;
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(EvalCommand, "eval",
                         "Accuracy on HellaSwag / Winogrande / multiple-choice files (llama-perplexity's formats), with "
                         "shared-prefix candidates");

}  // namespace estream::cli

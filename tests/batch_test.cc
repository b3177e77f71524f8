// The batch workflows as library calls, on the shared tiny models:
//  - batch::Score: every input line gets one output line in input order with its id; malformed
//    lines give an error line and count as failed, the rest is scored; results equal Engine::Run's;
//    a rerun skips every line already written; a torn output is cut and completed;
//  - shards (by line and by id, one shard's output torn mid-line and resumed) then
//    batch::MergeShardOutputs: the merged file equals one call's output; incomplete merges fail;
//  - batch::LoadTasks + batch::Evaluate: small hellaswag / winogrande / multiple-choice files
//    written here, with gold answers set from an independent scoring (each candidate sequence run
//    alone through Engine::Run) so the expected accuracy is known; every item's prediction and
//    score must match; bad files are refused with one line;
//  - batch::CandidateProbabilities / BestCandidate (classify).
// The CLI smoke tests (a score killed and resumed, eval's exit status) are batch_cli_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "batch/candidates.h"
#include "batch/eval.h"
#include "batch/merge.h"
#include "batch/score.h"
#include "batch/shard.h"
#include "batch_test_util.h"
#include "estream/engine.h"
#include "scratch_dir.h"
#include "tokenizer/tokenizer.h"

namespace estream {
namespace {

using namespace batch_test;  // NOLINT
using test_util::ScratchDir;

std::unique_ptr<Engine> LoadEngine(int64_t batch_tokens) {
  auto e = Engine::Load(kModel, {.n_threads = 2, .batch_tokens = batch_tokens});
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(Score, MixedLinesInInputOrder) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), out = dir.File("out.jsonl");
  std::string text;
  text += json({{"id", 1}, {"tokens", Ids(12, 1)}}).dump() + "\n";
  text += json({{"id", "two"}, {"prompt", "The quick brown fox"}, {"top_k", 3}}).dump() + "\n";
  text += "{not json\n";
  text += json({{"id", 4}, {"tokens", Ids(9, 4)}, {"continuations", {Ids(3, 5), Ids(1, 6)}}}).dump() + "\n";
  text += json({{"tokens", Ids(4, 7)}}).dump() + "\n";  // no id
  text += json({{"id", 6}, {"tokens", {1, 2, 999}}}).dump() + "\n";  // id out of range
  text += "\n";  // blank: ignored
  text += json({{"id", 7}, {"prompt", "Hello"}, {"continuations", {" world", " there"}}}).dump() + "\n";
  text += json({{"id", 8}, {"tokens", Ids(20, 8)}, {"embedding", "mean"}}).dump() + "\n";
  text += json({{"id", 9}, {"tokens", Ids(5, 9)}, {"continuations", {std::vector<int>{}}}}).dump() + "\n";
  text += json({{"id", 1}, {"tokens", Ids(3, 10)}}).dump() + "\n";  // duplicate id
  text += json({{"id", 11}, {"tokens", Ids(1, 11)}, {"prompt_logprobs", true}}).dump() + "\n";
  WriteFile(in, text);
  std::unique_ptr<Engine> e = LoadEngine(32);
  ASSERT_TRUE(e);
  const std::unique_ptr<Tokenizer> tok = ModelTokenizer();
  int progress_calls = 0;
  int64_t last_done = 0;
  auto s = batch::Score(*e, tok.get(),
                        {.input = in, .output = out, .progress = [&](const batch::ScoreProgress& p) {
                           ++progress_calls;
                           EXPECT_GT(p.lines_done, last_done);
                           EXPECT_EQ(p.lines_total, 11);
                           last_done = p.lines_done;
                         }});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->lines_ok, 6);
  EXPECT_EQ(s->lines_failed, 5);
  EXPECT_EQ(s->lines_skipped, 0);
  EXPECT_FALSE(s->all_ok());
  EXPECT_GE(progress_calls, 1);  // after each window
  EXPECT_EQ(last_done, 11);
  const std::vector<json> lines = ReadJsonl(out);
  ASSERT_EQ(lines.size(), 11u);
  const json ids = json::array({1, "two", nullptr, 4, nullptr, 6, 7, 8, 9, 1, 11});
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["id"], ids[i]) << i;
  for (int i : {2, 4, 5, 8, 9}) EXPECT_TRUE(lines[i].contains("error")) << lines[i].dump();
  for (int i : {0, 1, 3, 6, 7, 10}) EXPECT_FALSE(lines[i].contains("error")) << lines[i].dump();
  EXPECT_EQ(lines[2]["line"], 3);
  EXPECT_NE(lines[9]["error"].get<std::string>().find("duplicate"), std::string::npos);
  EXPECT_EQ(lines[1]["top"].size(), 3u);
  EXPECT_EQ(lines[3]["continuations"].size(), 2u);
  EXPECT_FALSE(lines[3].contains("top"));  // continuations: top_k defaults to 0
  EXPECT_EQ(lines[7]["embedding"].size(), 256u);
  EXPECT_EQ(lines[10]["prompt_logprobs"].size(), 0u);

  // Engine::Run's results for the same requests.
  auto r0 = e->Run({.tokens = Ids(12, 1), .top_k = 5});
  ASSERT_TRUE(r0.ok());
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(lines[0]["top"][j]["token"], r0->top[j].token);
    EXPECT_NEAR(lines[0]["top"][j]["logprob"].get<double>(), r0->top[j].logprob, 1e-6);
  }
  Request rc{.tokens = Ids(9, 4), .top_k = 0};
  rc.continuations = {Ids(3, 5), Ids(1, 6)};
  auto r3 = e->Run(rc);
  ASSERT_TRUE(r3.ok());
  for (int j = 0; j < 2; ++j) {
    EXPECT_NEAR(lines[3]["continuations"][j]["logprob"].get<double>(), r3->continuations[j].log_likelihood, 1e-6);
    EXPECT_EQ(lines[3]["continuations"][j]["is_greedy"], r3->continuations[j].is_greedy);
  }

  // A rerun finds everything done: nothing appended, the failed lines still counted.
  s = batch::Score(*e, tok.get(), {.input = in, .output = out});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->lines_ok + s->lines_failed, 0);
  EXPECT_EQ(s->lines_skipped, 11);
  EXPECT_EQ(s->lines_failed_before, 5);
  EXPECT_FALSE(s->all_ok());
  EXPECT_EQ(ReadJsonl(out).size(), 11u);

  // A torn last line is cut (with a warning) and the run completes the file.
  const std::string full = ReadFile(out);
  WriteFile(out, full.substr(0, full.size() / 2));
  std::vector<std::string> warnings;
  s = batch::Score(*e, tok.get(),
                   {.input = in, .output = out, .warn = [&](const std::string& w) { warnings.push_back(w); }});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("torn line"), std::string::npos) << warnings[0];
  const std::vector<json> again = ReadJsonl(out);
  ASSERT_EQ(again.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) ExpectSameJson(again[i], lines[i], "line " + std::to_string(i));

  // An input that cannot be read: IOError naming it, no output created.
  const std::string none = dir.File("none.jsonl");
  s = batch::Score(*e, tok.get(), {.input = dir.File("missing.jsonl"), .output = none});
  EXPECT_EQ(s.status().code(), StatusCode::kIOError);
  EXPECT_NE(s.status().message().find("missing.jsonl"), std::string::npos);
  EXPECT_FALSE(std::ifstream(none).good());
}

// The output is checked before anything is written to it: a directory, a device or a pipe, the
// input itself, a file whose JSON lines are not results (an input swapped for the output: even
// its last line without a newline is not cut as "torn"), and a file another run holds locked are
// refused with one line, and none of them is changed.
TEST(Score, RefusesOutputsThatAreNotItsOwnFile) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), out = dir.File("out.jsonl");
  const std::string input = json({{"id", 1}, {"tokens", Ids(5, 1)}}).dump() + "\n" +
                            json({{"id", 2}, {"tokens", Ids(4, 2)}}).dump();  // no final newline
  WriteFile(in, input);
  std::unique_ptr<Engine> e = LoadEngine(32);
  ASSERT_TRUE(e);
  auto refused = [&](const std::string& output, StatusCode code, const std::string& words) {
    auto s = batch::Score(*e, nullptr, {.input = in, .output = output});
    ASSERT_FALSE(s.ok()) << output;
    EXPECT_EQ(s.status().code(), code) << s.status().message();
    EXPECT_NE(s.status().message().find(words), std::string::npos) << s.status().message();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos);
  };
  refused(in, StatusCode::kInvalidArgument, "is the input file");
  refused(dir.path(), StatusCode::kInvalidArgument, "is not a regular file");  // the rule, not EISDIR
  refused("/dev/null", StatusCode::kInvalidArgument, "not a regular file");
  const std::string other = dir.File("other.jsonl");
  WriteFile(other, input);
  refused(other, StatusCode::kInvalidArgument, "not a result of estream score");
  EXPECT_EQ(ReadFile(in), input);
  EXPECT_EQ(ReadFile(other), input);

  // A second run on an output that a first one holds (its lock, taken here as Score takes it).
  const int fd = open(out.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  refused(out, StatusCode::kIOError, "being written by another");
  close(fd);
  auto s = batch::Score(*e, nullptr, {.input = in, .output = out});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->lines_ok, 2);
  EXPECT_EQ(ReadJsonl(out).size(), 2u);
}

TEST(Score, ShardsMergeToTheSingleProcessOutput) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), single = dir.File("single.jsonl");
  const int n = 45;
  WriteFile(in, ShardInput(n));
  std::unique_ptr<Engine> e = LoadEngine(48);
  ASSERT_TRUE(e);
  auto score = [&](const std::string& out, batch::ShardSpec shard) {
    auto s = batch::Score(*e, nullptr, {.input = in, .output = out, .shard = shard});
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? *s : batch::ScoreSummary{};
  };
  EXPECT_FALSE(score(single, {}).all_ok());  // bad lines
  const std::vector<json> want = ReadJsonl(single);
  ASSERT_EQ(want.size(), static_cast<size_t>(n + 1));
  for (const char* by : {"line", "id"}) {
    for (int shards : {1, 3, 4}) {
      SCOPED_TRACE(std::string(by) + " " + std::to_string(shards));
      batch::MergeOptions merge;
      int64_t total = 0;
      for (int s = 0; s < shards; ++s) {
        const std::string out = dir.File(std::string(by) + std::to_string(shards) + "." + std::to_string(s));
        auto spec = batch::ParseShardSpec(std::to_string(s) + "/" + std::to_string(shards), by);
        ASSERT_TRUE(spec.ok());
        score(out, *spec);
        if (s == 1) {  // as if stopped mid-write: cut inside a line, then resumed
          const std::string full = ReadFile(out);
          WriteFile(out, full.substr(0, full.size() / 3));
          const batch::ScoreSummary resumed = score(out, *spec);
          EXPECT_GT(resumed.lines_skipped, 0);
        }
        total += static_cast<int64_t>(ReadJsonl(out).size());
        merge.shard_outputs.push_back(out);
      }
      EXPECT_EQ(total, n + 1);
      merge.input = in;
      merge.output = dir.File(std::string("all.") + by + std::to_string(shards));
      auto m = batch::MergeShardOutputs(merge);
      ASSERT_TRUE(m.ok()) << m.status().message();
      EXPECT_GT(m->error_lines, 0);
      const std::vector<json> got = ReadJsonl(merge.output);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) ExpectSameJson(got[i], want[i], "line " + std::to_string(i));
    }
  }
  // The repeated id's error line names its line; the id-less line too.
  EXPECT_EQ(want[7]["line"], 8);
  EXPECT_EQ(want[11]["line"], 13);  // physical line 13: after the blank line 11
  EXPECT_NE(want[11]["error"].get<std::string>().find("duplicate id \"s2\""), std::string::npos);
}

TEST(Score, IncompleteMergesFailAndWriteNothing) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl");
  WriteFile(in, ShardInput(12));
  std::unique_ptr<Engine> e = LoadEngine(48);
  ASSERT_TRUE(e);
  const std::string s0 = dir.File("s0.jsonl"), s1 = dir.File("s1.jsonl"), all = dir.File("all.jsonl");
  for (int s = 0; s < 2; ++s) {
    auto spec = batch::ParseShardSpec(std::to_string(s) + "/2");
    ASSERT_TRUE(spec.ok());
    ASSERT_TRUE(batch::Score(*e, nullptr, {.input = in, .output = s ? s1 : s0, .shard = *spec}).ok());
  }
  EXPECT_FALSE(batch::MergeShardOutputs({.shard_outputs = {s0}, .input = in, .output = all}).ok());  // a shard missing
  EXPECT_FALSE(batch::MergeShardOutputs({.shard_outputs = {s0, s1, s1}, .input = in, .output = all}).ok());
  EXPECT_FALSE(std::ifstream(all).good());
  auto m = batch::MergeShardOutputs({.shard_outputs = {s0, s1}, .input = in, .output = all});
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->lines, 12);
  EXPECT_GT(m->error_lines, 0);
  EXPECT_EQ(ReadJsonl(all).size(), 12u);
}

// ---- eval ----

// log p(seq[p] | seq[0..p)) for p = 1..len-1, running the sequence alone.
std::vector<double> Logprobs(Engine& e, const std::vector<int32_t>& seq) {
  auto r = e.Run({.tokens = seq, .top_k = 0, .prompt_logprobs = true});
  EXPECT_TRUE(r.ok());
  std::vector<double> lp(seq.size(), 0.0);
  for (size_t p = 1; p < seq.size(); ++p) lp[p] = r->prompt_logprobs[p - 1];
  return lp;
}

size_t CommonPrefix(const std::vector<std::vector<int32_t>>& seqs) {
  size_t k = 0;
  for (;; ++k) {
    for (const auto& s : seqs)
      if (k >= s.size() - 1 || s[k] != seqs[0][k]) return k;
  }
}

// Mean log-probability of the tokens after the common prefix, each sequence run alone.
std::vector<double> MeanScores(Engine& e, const std::vector<std::vector<int32_t>>& seqs) {
  const size_t cp = CommonPrefix(seqs);
  std::vector<double> out;
  for (const auto& s : seqs) {
    const std::vector<double> lp = Logprobs(e, s);
    double sum = 0;
    for (size_t p = cp; p < s.size(); ++p) sum += lp[p];
    out.push_back(sum / static_cast<double>(s.size() - cp));
  }
  return out;
}

int Best(const std::vector<double>& v) {
  int b = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[b]) b = static_cast<int>(i);
  return b;
}

class EvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = LoadEngine(200);
    tok_ = ModelTokenizer();
    ASSERT_TRUE(engine_ && tok_);
  }
  std::vector<int32_t> Tok(const std::string& s) const { return tok_->Encode(s, true, false); }

  // LoadTasks + Evaluate of `data`; the error of either as a failed Result.
  Result<batch::EvalResult> Eval(batch::EvalKind kind, const std::string& data, int64_t n_tasks = 0) {
    ESTREAM_ASSIGN_OR_RETURN(std::vector<batch::EvalTask> tasks,
                             batch::LoadTasks(kind, data, *tok_, {.n_tasks = n_tasks, .name = "file"}));
    return batch::Evaluate(*engine_, kind, tasks);
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Tokenizer> tok_;
};

const char* kWords[] = {"the cat", "a dog", "ran far", "sat down", "green tea", "old man", "blue sky", "hot sun",
                        "on the mat", "in the park", "at home", "by the sea", "with a hat", "under a tree"};

TEST_F(EvalTest, Hellaswag) {
  std::string text;
  const int n = 12;
  std::vector<int> predicted(n);
  std::vector<std::vector<double>> scores(n);
  int64_t want_tokens = 0;
  for (int t = 0; t < n; ++t) {
    const std::string ctx = std::string("Story ") + kWords[t % 14] + " and " + kWords[(t + 3) % 14] + ":";
    std::vector<std::string> endings;
    std::vector<std::vector<int32_t>> seqs;
    for (int k = 0; k < 4; ++k) {
      endings.push_back(std::string(kWords[(t + k * 5) % 14]) + " " + kWords[(t * 3 + k) % 14] + ".");
      seqs.push_back(Tok(ctx + " " + endings.back()));
    }
    scores[t] = MeanScores(*engine_, seqs);
    predicted[t] = Best(scores[t]);
    // The tokens the shared-prefix request runs: the common prefix (at most all but one token of
    // the shortest) once, then every candidate's rest.
    size_t cp = seqs[0].size();
    for (const auto& q : seqs) {
      cp = std::min(cp, q.size() - 1);
      for (size_t i = 0; i < cp; ++i)
        if (q[i] != seqs[0][i]) cp = i;
    }
    want_tokens += static_cast<int64_t>(cp);
    for (const auto& q : seqs) want_tokens += static_cast<int64_t>(q.size() - cp);
    const int gold = t % 3 == 0 ? (predicted[t] + 1) % 4 : predicted[t];  // 8 of 12 correct
    text += ctx + "\n" + std::to_string(gold) + "\n";
    for (const std::string& s : endings) text += s + "\n";
  }
  auto r = Eval(batch::EvalKind::kHellaswag, text);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->n_tasks, n);
  EXPECT_EQ(r->n_failed, 0);
  EXPECT_EQ(r->n_correct, 8);
  EXPECT_NEAR(r->accuracy, 8.0 / 12, 1e-12);
  EXPECT_NEAR(r->standard_error, std::sqrt((8.0 / 12) * (4.0 / 12) / 11), 1e-12);
  EXPECT_LT(r->wilson_lo, r->accuracy);
  EXPECT_GT(r->wilson_hi, r->accuracy);
  EXPECT_NEAR(r->random_chance(), 0.25, 1e-12);
  // Every pass counted once (passes are packed longest first, not in task order).
  EXPECT_EQ(r->tokens, want_tokens);
  EXPECT_GT(r->tokens_separate, r->tokens);
  for (const batch::EvalItem& it : r->items) {
    EXPECT_EQ(it.predicted, predicted[it.index]) << it.index;
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(it.scores[k], scores[it.index][k], 1e-5) << it.index;
    EXPECT_EQ(it.line, 6 * it.index + 1);  // the task's first line (its context)
  }
  // The JSON writer says the same.
  const json j = json::parse(batch::EvalJson(*r));
  EXPECT_EQ(j["task"], "hellaswag");
  EXPECT_EQ(j["n_correct"], 8);
  EXPECT_NEAR(j["accuracy"].get<double>(), 100.0 * 8 / 12, 1e-9);
  EXPECT_EQ(j["items"].size(), 12u);
  EXPECT_NE(batch::EvalText(*r).find("hellaswag: 12 tasks, accuracy 66.6667% +/- "), std::string::npos);
  // n_tasks keeps N tasks (llama.cpp's random pick), bad files are refused with one line.
  auto five = Eval(batch::EvalKind::kHellaswag, text, 5);
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(five->items.size(), 5u);
  for (const batch::EvalItem& it : five->items) EXPECT_EQ(it.predicted, predicted[it.index]);
  auto bad = Eval(batch::EvalKind::kHellaswag, "only\nfive\nlines\nhere\nnow\n");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().find('\n'), std::string::npos);
  // Read as llama-perplexity reads it (its -f reader drops one final newline): one blank line at
  // the end, or none, is the same file; a second blank line is a line of its own.
  for (const std::string& variant : {text + "\n", text.substr(0, text.size() - 1)}) {
    auto tasks = batch::LoadTasks(batch::EvalKind::kHellaswag, variant, *tok_, {.name = "file"});
    ASSERT_TRUE(tasks.ok()) << tasks.status().message();
    EXPECT_EQ(tasks->size(), static_cast<size_t>(n));
  }
  auto two_blank = batch::LoadTasks(batch::EvalKind::kHellaswag, text + "\n\n", *tok_, {.name = "file"});
  EXPECT_NE(two_blank.status().message().find("73 lines, not a multiple of 6"), std::string::npos)
      << two_blank.status().message();
}

TEST_F(EvalTest, Winogrande) {
  std::string text = "index,sentence,option1,option2,answer\n";  // a header: skipped (answer not 1/2)
  const int n = 10;
  int correct = 0;
  std::vector<int> predicted(n);
  std::vector<std::array<double, 2>> scores(n);
  for (int t = 0; t < n; ++t) {
    // Long tails (partial scoring) for most, a short one for t % 4 == 3.
    const std::string tail = t % 4 == 3 ? std::string(".") : std::string(" was ") + kWords[(t + 2) % 14] + " " +
                                                                   kWords[(t + 6) % 14] + " again.";
    const std::string sentence = std::string("When ") + kWords[t % 14] + " met _" + tail;
    // Short tails with one-letter choices: at most 3 tokens after the common prefix, so the
    // choice words are scored (and llama.cpp's rule for choice 2's first token applies).
    const std::string c[2] = {t % 4 == 3 ? std::string(1, static_cast<char>('a' + t)) : kWords[(t + 1) % 14],
                              t % 4 == 3 ? std::string(1, static_cast<char>('p' + t)) : kWords[(t + 9) % 14]};
    std::vector<std::vector<int32_t>> seqs;
    std::vector<size_t> base;
    const size_t blank = sentence.find('_');
    for (const std::string& ch : c) {
      seqs.push_back(Tok(sentence.substr(0, blank) + ch + sentence.substr(blank + 1)));
      base.push_back(Tok(sentence.substr(0, blank) + ch).size());
    }
    const size_t cp = CommonPrefix(seqs);
    const bool partial = seqs[0].size() - cp > 3 && seqs[1].size() - cp > 3;
    EXPECT_EQ(partial, t % 4 != 3) << t;
    // llama-perplexity's rule for short tails: choice 2's first token is scored after the whole
    // of sequence 1 (its "FIXME").
    std::vector<int32_t> s1_then = seqs[0];
    s1_then.push_back(seqs[1][cp]);
    const double fixme = Logprobs(*engine_, s1_then).back();
    double sc[2];
    for (int s = 0; s < 2; ++s) {
      const std::vector<double> lp = Logprobs(*engine_, seqs[s]);
      const size_t b = partial ? base[s] : cp;
      const size_t last = seqs[s].size() - b > 1 ? 1 : 0;
      double sum = 0;
      for (size_t p = b; p < seqs[s].size() - last; ++p) sum += s == 1 && !partial && p == cp ? fixme : lp[p];
      sc[s] = sum / static_cast<double>(seqs[s].size() - b - last);
    }
    predicted[t] = sc[0] > sc[1] ? 0 : 1;
    scores[t] = {sc[0], sc[1]};
    const int answer = t % 2 == 0 ? predicted[t] + 1 : 2 - predicted[t];  // even: right, odd: wrong
    correct += t % 2 == 0;
    const bool quote = t % 3 == 0;
    text += std::to_string(t) + "," + (quote ? "\"" + sentence + "\"" : sentence) + "," + c[0] + "," + c[1] + "," +
            std::to_string(answer) + "\n";
  }
  // A last line that llama-perplexity does not score (its reader stops at the end of the text
  // before using it), with or without the final newline: not scored here either.
  const std::string last = "10,When the cat met _.,a dog,the sun,1";
  std::vector<std::string> warnings;
  auto tasks = batch::LoadTasks(batch::EvalKind::kWinogrande, text + last, *tok_,
                                {.name = "wg.csv", .warn = [&](const std::string& w) { warnings.push_back(w); }});
  ASSERT_TRUE(tasks.ok()) << tasks.status().message();
  ASSERT_EQ(warnings.size(), 2u);  // the header, the last line
  EXPECT_EQ(warnings[0], "note: wg.csv: the last line is not scored, as llama-perplexity does not score it (its "
                         "reader stops at the end of the file before using the line)");
  EXPECT_EQ(warnings[1], "warning: wg.csv line 1: no '_' in the sentence; skipped");
  // A file of one line: that line is the last, so there is no task; said so, without the note.
  warnings.clear();
  auto one_line = batch::LoadTasks(batch::EvalKind::kWinogrande, last + "\n", *tok_,
                                   {.name = "wg.csv", .warn = [&](const std::string& w) { warnings.push_back(w); }});
  EXPECT_EQ(one_line.status().message(),
            "wg.csv: no winogrande tasks: the file's only line is its last line, which llama-perplexity does not "
            "score (its reader stops at the end of the file before using the line); add a line after it: "
            "llama-perplexity scores every line but the last");
  EXPECT_TRUE(warnings.empty());
  auto with_newline = batch::LoadTasks(batch::EvalKind::kWinogrande, text + last + "\n", *tok_, {.name = "wg.csv"});
  ASSERT_TRUE(with_newline.ok());
  EXPECT_EQ(with_newline->size(), static_cast<size_t>(n));
  auto r = batch::Evaluate(*engine_, batch::EvalKind::kWinogrande, *tasks);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->n_tasks, n);
  EXPECT_EQ(r->n_correct, correct);
  for (const batch::EvalItem& it : r->items) {
    EXPECT_EQ(it.predicted, predicted[it.index]) << it.index;
    for (int k = 0; k < 2; ++k) EXPECT_NEAR(it.scores[k], scores[it.index][k], 1e-5) << it.index;
    EXPECT_EQ(it.line, it.index + 2);  // the file's line (after the skipped header), not the task count
  }
  EXPECT_EQ(json::parse(batch::EvalJson(*r))["items"][3]["line"], 5);
}

// A '_' that ends the sentence: partial scoring has no token to average (NaN scores), so choice 2
// is picked, as llama-perplexity picks it; the verdict is kept and a warning names the line.
TEST_F(EvalTest, WinograndeBlankAtTheEndWarnsAndPicksChoice2) {
  const std::string text =
      "0,I gave the book to _,Sarah Elizabeth Margaret Johnson,Maria Anne Lee Parker,1\n"
      "1,When the cat met _ it was happy again.,the old dog,the blue sky,1\n"
      "2,last line _ not scored,a,b,1\n";
  std::vector<std::string> warnings;
  auto tasks = batch::LoadTasks(batch::EvalKind::kWinogrande, text, *tok_,
                                {.name = "wg.csv", .warn = [&](const std::string& w) { warnings.push_back(w); }});
  ASSERT_TRUE(tasks.ok()) << tasks.status().message();
  ASSERT_EQ(tasks->size(), 2u);
  ASSERT_EQ(warnings.size(), 2u);  // the last-line note, then line 1
  EXPECT_EQ(warnings[1], "warning: wg.csv line 1: nothing follows the choices (the '_' ends the sentence), so no "
                         "token is scored: the scores are NaN and choice 2 is picked, as llama-perplexity picks it");
  auto r = batch::Evaluate(*engine_, batch::EvalKind::kWinogrande, *tasks);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->items[0].error.empty());
  EXPECT_TRUE(std::isnan(r->items[0].scores[0]) && std::isnan(r->items[0].scores[1]));
  EXPECT_EQ(r->items[0].predicted, 1);
  EXPECT_FALSE(r->items[0].correct);
  EXPECT_FALSE(std::isnan(r->items[1].scores[0]));
}

// Figures that are not defined are not zero: with every task failed, accuracy, standard error,
// interval and random chance are NaN (JSON null) and the text says no task was scored; with one
// task, the standard error (its n - 1 is 0) is NaN / null / "undefined".
TEST_F(EvalTest, UndefinedFiguresAreNullNotZero) {
  batch::EvalTask bad;  // token ids past the vocabulary: the engine refuses the request
  bad.seqs = {{1, 2, 100000}, {1, 2, 100001}};
  bad.labels = {1, 0};
  auto none = batch::Evaluate(*engine_, batch::EvalKind::kHellaswag, {bad, bad});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->n_tasks, 0);
  EXPECT_EQ(none->n_failed, 2);
  EXPECT_TRUE(std::isnan(none->accuracy) && std::isnan(none->standard_error) && std::isnan(none->wilson_lo) &&
              std::isnan(none->random_chance()));
  json j = json::parse(batch::EvalJson(*none));
  for (const char* k : {"accuracy", "stderr", "wilson95", "random_chance"}) EXPECT_TRUE(j[k].is_null()) << k;
  EXPECT_EQ(batch::EvalText(*none), "hellaswag: no task was scored: all 2 failed (see stderr)\n");

  batch::EvalTask good;
  for (const char* e : {" a cat sat.", " a dog ran."}) good.seqs.push_back(Tok(std::string("The story") + e));
  good.labels = {1, 0};
  auto one = batch::Evaluate(*engine_, batch::EvalKind::kHellaswag, {good});
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->n_tasks, 1);
  EXPECT_FALSE(std::isnan(one->accuracy));
  EXPECT_TRUE(std::isnan(one->standard_error));
  j = json::parse(batch::EvalJson(*one));
  EXPECT_TRUE(j["accuracy"].is_number());
  EXPECT_TRUE(j["stderr"].is_null());
  EXPECT_EQ(j["wilson95"].size(), 2u);
  EXPECT_NE(batch::EvalText(*one).find("% +/- undefined (one task)"), std::string::npos) << batch::EvalText(*one);
}

// llama.cpp's multiple-choice binary format.
std::string McFile(const std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>& tasks) {
  auto u32 = [](std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); };
  auto str = [&](std::string* s, const std::string& t) {
    u32(s, static_cast<uint32_t>(t.size()));
    *s += t;
  };
  std::string body;
  std::vector<uint32_t> offsets;
  const uint32_t header = 4 + 4 * static_cast<uint32_t>(tasks.size());
  for (const auto& [q, answers] : tasks) {
    offsets.push_back(header + static_cast<uint32_t>(body.size()));
    str(&body, q);
    u32(&body, static_cast<uint32_t>(answers.size()));
    for (const auto& a : answers) str(&body, a.first);
    for (const auto& a : answers) u32(&body, static_cast<uint32_t>(a.second));
    u32(&body, 0);  // mc2: no answers
  }
  std::string out;
  u32(&out, static_cast<uint32_t>(tasks.size()));
  for (uint32_t o : offsets) u32(&out, o);
  return out + body;
}

TEST_F(EvalTest, MultipleChoice) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> tasks;
  int correct = 0;
  for (int t = 0; t < 9; ++t) {
    const std::string q = std::string("Question: where is ") + kWords[t % 14] + "? Answer:";
    const int n_ans = 2 + t % 4;
    std::vector<std::vector<int32_t>> seqs;
    std::vector<std::string> answers;
    for (int a = 0; a < n_ans; ++a) {
      answers.push_back(kWords[(t + 4 * a + 1) % 14]);
      seqs.push_back(Tok(q + " " + answers.back()));
    }
    const int best = Best(MeanScores(*engine_, seqs));
    const int right = t % 3 == 1 ? (best + 1) % n_ans : best;
    correct += right == best;
    std::vector<std::pair<std::string, int>> as;
    for (int a = 0; a < n_ans; ++a) as.push_back({answers[a], a == right ? 1 : 0});
    tasks.push_back({q, as});
  }
  const std::string bytes = McFile(tasks);
  auto r = Eval(batch::EvalKind::kMultipleChoice, bytes);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->n_tasks, 9);
  EXPECT_EQ(r->n_correct, correct);
  // A truncated file: one-line error naming the task.
  auto bad = Eval(batch::EvalKind::kMultipleChoice, bytes.substr(0, bytes.size() - 7));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("task 8"), std::string::npos) << bad.status().message();
  // A corrupt task count is refused before anything is allocated for it (it once asked for 16 GiB;
  // found by fuzz/text_fuzz.cc).
  const std::string huge = std::string("\xff\xff\xff\xff", 4) + bytes.substr(4);
  auto too_many = Eval(batch::EvalKind::kMultipleChoice, huge);
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("4294967295 tasks do not fit"), std::string::npos)
      << too_many.status().message();
  // Each defect named: more answers than llama-perplexity's 100, an offset past the end (read
  // when a subset seeks to it).
  std::vector<std::pair<std::string, int>> lots;
  for (int a = 0; a < 101; ++a) lots.push_back({kWords[a % 14], a == 0 ? 1 : 0});
  auto big = Eval(batch::EvalKind::kMultipleChoice, McFile({{"Question: which?", lots}}));
  EXPECT_EQ(big.status().message(), "file: task 0 has 101 mc1 answers, more than the 100 llama-perplexity reads");
  std::string far = bytes;
  for (size_t t = 0; t < 9; ++t) std::memcpy(far.data() + 4 + 4 * t, "\x00\xff\xff\xff", 4);
  auto past = Eval(batch::EvalKind::kMultipleChoice, far, /*n_tasks=*/3);
  EXPECT_NE(past.status().message().find("'s offset 4294967040 is past the end of the file (" +
                                         std::to_string(far.size()) + " bytes)"),
            std::string::npos)
      << past.status().message();
  // Text that is not valid UTF-8 is tokenized with U+FFFD, with a warning (once).
  tasks[2].first = "Question: where is caf\xe9? Answer:";
  tasks[4].first = "Question: where is \xff? Answer:";
  std::vector<std::string> warnings;
  auto latin1 = batch::LoadTasks(batch::EvalKind::kMultipleChoice, McFile(tasks), *tok_,
                                 {.name = "mc.bin", .warn = [&](const std::string& w) { warnings.push_back(w); }});
  ASSERT_TRUE(latin1.ok()) << latin1.status().message();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "warning: mc.bin: task 2 is not valid UTF-8; each ill-formed sequence is tokenized as "
                         "U+FFFD (other such tasks are not reported)");
}

// Text files that are not valid UTF-8 get the warning perplexity and tokenize give; a file of
// another format given as winogrande (thousands of bad lines) gives 10 line warnings, then a count.
TEST_F(EvalTest, WarningsForBadTextAreOneLineEachAndCapped) {
  std::vector<std::string> warnings;
  auto collect = [&](const std::string& w) { warnings.push_back(w); };
  std::string hs = "The story of the caf\xe9:\n0\n";
  for (const char* e : {"a cat sat.", "a dog ran.", "the sun set.", "the tea cooled."}) hs += std::string(e) + "\n";
  ASSERT_TRUE(batch::LoadTasks(batch::EvalKind::kHellaswag, hs, *tok_, {.name = "hs.txt", .warn = collect}).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "warning: hs.txt is not valid UTF-8 (first bad byte at offset 20); each ill-formed "
                         "sequence is tokenized as U+FFFD");
  warnings.clear();
  std::string lines;
  for (int i = 0; i < 30; ++i) lines += "not a winogrande line\n";
  lines += "0,When the cat met _ it sat.,the dog,the sun,1\n1,last,a,b,1\n";
  auto wg = batch::LoadTasks(batch::EvalKind::kWinogrande, lines, *tok_, {.name = "wg.csv", .warn = collect});
  ASSERT_TRUE(wg.ok()) << wg.status().message();
  EXPECT_EQ(wg->size(), 1u);
  ASSERT_EQ(warnings.size(), 12u);  // the last-line note, 10 lines, the count
  EXPECT_EQ(warnings[10], "warning: wg.csv line 10: not 5 comma-separated fields; skipped");
  EXPECT_EQ(warnings[11], "warning: wg.csv: 20 more lines warned about as above (not shown)");
}

TEST(EvalKind, NamesRoundTrip) {
  for (batch::EvalKind k : {batch::EvalKind::kHellaswag, batch::EvalKind::kWinogrande, batch::EvalKind::kMultipleChoice}) {
    auto p = batch::ParseEvalKind(batch::EvalKindName(k));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, k);
  }
  EXPECT_FALSE(batch::ParseEvalKind("mmlu").ok());
}

// ---- candidates (classify) ----

TEST(Candidates, ProbabilitiesAndBest) {
  std::vector<ContinuationScore> c(4);
  const double ll[] = {-3.25, -0.5, -7.0, -0.5};
  for (int i = 0; i < 4; ++i) c[i].log_likelihood = ll[i];
  const std::vector<double> p = batch::CandidateProbabilities(c);
  ASSERT_EQ(p.size(), 4u);
  double sum = 0, z = 0;
  for (double x : ll) z += std::exp(x);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(p[i], std::exp(ll[i]) / z, 1e-15) << i;
    sum += p[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-15);
  EXPECT_EQ(batch::BestCandidate(c), 1u);  // the first of the tie
  // Huge log-likelihoods do not overflow (the max is subtracted).
  const std::vector<double> big = batch::CandidateProbabilities(std::vector<double>{-1e4, -1e4 - std::log(3.0)});
  EXPECT_NEAR(big[0], 0.75, 1e-12);
  EXPECT_TRUE(batch::CandidateProbabilities(std::vector<double>{}).empty());
}

}  // namespace
}  // namespace estream

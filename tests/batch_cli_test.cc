// `estream score` and `estream eval` end to end on the shared tiny models (issue 16):
//  - score: every input line gets one output line in input order with its id; malformed lines give
//    an error line and a non-zero exit status, the rest is scored; results equal the library's;
//  - score resume: runs killed (SIGKILL) at random points, plus a torn last line, then completed:
//    every id exactly once, results equal an uninterrupted run's;
//  - score --shard I/N (by line and by id, one shard killed and resumed) then --merge: the merged
//    file equals one process's output; bad shard specs and incomplete merges fail before any work;
//  - eval: small hellaswag / winogrande / multiple-choice files written here, with gold answers set
//    from an independent scoring (each candidate sequence run alone through Engine::Run) so the
//    expected accuracy is known; every item's prediction and score must match.
// Nothing is timed (the kill delays are random, only the results are checked).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "model_test_util.h"
#include "tokenizer/tokenizer.h"

extern char** environ;

namespace estream {
namespace {

using nlohmann::json;
using model_test::ScratchDir;

const std::string kCli = ESTREAM_CLI;
const std::string kModel = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/qwen3moe-tiny-f32.gguf";

// Runs the CLI with `args`; returns the exit status (-signal when killed). kill_after_ms >= 0:
// SIGKILL it after that many milliseconds if it is still running.
int RunCli(const std::vector<std::string>& args, int kill_after_ms = -1, const std::string& stdout_path = "") {
  std::vector<std::string> all = {kCli};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.empty() ? "/dev/null" : stdout_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  EXPECT_EQ(posix_spawn(&pid, kCli.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  if (kill_after_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
    kill(pid, SIGKILL);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

std::vector<json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Two results agree: same keys, numbers within 1e-5 relative (+1e-6 absolute).
void ExpectSameJson(const json& a, const json& b, const std::string& where) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    EXPECT_LE(std::fabs(x - y), 1e-5 * std::fabs(y) + 1e-6) << where;
    return;
  }
  ASSERT_EQ(a.type(), b.type()) << where << ": " << a.dump() << " vs " << b.dump();
  if (a.is_array()) {
    ASSERT_EQ(a.size(), b.size()) << where;
    for (size_t i = 0; i < a.size(); ++i) ExpectSameJson(a[i], b[i], where + "[" + std::to_string(i) + "]");
  } else if (a.is_object()) {
    ASSERT_EQ(a.size(), b.size()) << where << ": " << a.dump() << " vs " << b.dump();
    for (auto it = a.begin(); it != a.end(); ++it) {
      ASSERT_TRUE(b.contains(it.key())) << where << "." << it.key();
      ExpectSameJson(it.value(), b[it.key()], where + "." + it.key());
    }
  } else {
    EXPECT_EQ(a, b) << where;
  }
}

std::vector<int32_t> Ids(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 53 + salt * 17 + 3) % 512;
  return ids;
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
  EXPECT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", out, "-t", "2", "--batch-tokens", "32"}), 1);
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

  // The library's results for the same requests.
  auto e = Engine::Load(kModel, {.n_threads = 2});
  ASSERT_TRUE(e.ok());
  auto r0 = (*e)->Run({.tokens = Ids(12, 1), .top_k = 5});
  ASSERT_TRUE(r0.ok());
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(lines[0]["top"][j]["token"], r0->top[j].token);
    EXPECT_NEAR(lines[0]["top"][j]["logprob"].get<double>(), r0->top[j].logprob, 1e-6);
  }
  Request rc{.tokens = Ids(9, 4), .top_k = 0};
  rc.continuations = {Ids(3, 5), Ids(1, 6)};
  auto r3 = (*e)->Run(rc);
  ASSERT_TRUE(r3.ok());
  for (int j = 0; j < 2; ++j) {
    EXPECT_NEAR(lines[3]["continuations"][j]["logprob"].get<double>(), r3->continuations[j].log_likelihood, 1e-6);
    EXPECT_EQ(lines[3]["continuations"][j]["is_greedy"], r3->continuations[j].is_greedy);
  }

  // A rerun finds everything done: nothing appended, still exit 1 (failed lines are in OUT).
  EXPECT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", out, "-t", "2"}), 1);
  EXPECT_EQ(ReadJsonl(out).size(), 11u);
}

TEST(Score, ResumeAfterKillsAndTornLine) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), clean = dir.File("clean.jsonl"), out = dir.File("out.jsonl");
  std::string text;
  const int n = 240;
  for (int i = 0; i < n; ++i) {
    json j = {{"id", "r" + std::to_string(i)}, {"tokens", Ids(1 + (i * 7) % 29, i)}, {"top_k", 2}};
    if (i % 5 == 0) j["continuations"] = {Ids(2, i + 1), Ids(3, i + 2)};
    text += j.dump() + "\n";
  }
  WriteFile(in, text);
  const std::vector<std::string> common = {"-m", kModel, "--input", in, "-t", "2", "--batch-tokens", "48"};
  auto args = [&](const std::string& o) {
    std::vector<std::string> a = {"score"};
    a.insert(a.end(), common.begin(), common.end());
    a.push_back("--output");
    a.push_back(o);
    return a;
  };
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(RunCli(args(clean)), 0);
  const int clean_ms = static_cast<int>(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  const std::vector<json> want = ReadJsonl(clean);
  ASSERT_EQ(want.size(), static_cast<size_t>(n));

  std::mt19937 rng(static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int round = 0; round < 3; ++round) {
    const int delay = std::uniform_int_distribution<int>(0, std::max(1, clean_ms))(rng);
    std::printf("round %d: kill after %d ms (a clean run took %d ms)\n", round, delay, clean_ms);
    RunCli(args(out), delay);
  }
  // A torn last line, as a crash in the middle of a write leaves it.
  {
    std::ofstream o(out, std::ios::app | std::ios::binary);
    o << "{\"id\": \"r9";
  }
  ASSERT_EQ(RunCli(args(out)), 0);
  const std::vector<json> got = ReadJsonl(out);
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ExpectSameJson(got[i], want[i], "line " + std::to_string(i));
}

// ---- shards (issue 24) ----

// An input with every kind of line (ids of both types, an id-less line, a repeated id, bad JSON,
// a bad token, a blank line, continuations).
std::string ShardInput(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    json j = {{"id", i % 4 == 1 ? json(i) : json("s" + std::to_string(i))}, {"tokens", Ids(1 + (i * 5) % 23, i)},
              {"top_k", 2}};
    if (i % 6 == 0) j["continuations"] = {Ids(2, i + 1), Ids(1, i + 2)};
    if (i == 7) j.erase("id");
    if (i == 11) j["id"] = "s2";  // repeated id: an error line keyed by its line number
    if (i == 13) j["tokens"] = {1, 99999};
    text += j.dump() + "\n";
    if (i == 9) text += "\n";
    if (i == 17) text += "{not json\n";
  }
  return text;
}

TEST(Score, ShardsMergeToTheSingleProcessOutput) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), single = dir.File("single.jsonl");
  const int n = 45;
  WriteFile(in, ShardInput(n));
  const std::vector<std::string> common = {"-m", kModel, "--input", in, "-t", "1", "--batch-tokens", "48"};
  auto score = [&](const std::string& out, std::vector<std::string> extra, int kill_after_ms = -1) {
    std::vector<std::string> a = {"score"};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"--output", out});
    a.insert(a.end(), extra.begin(), extra.end());
    return RunCli(a, kill_after_ms);
  };
  ASSERT_EQ(score(single, {}), 1);  // bad lines: exit 1
  const std::vector<json> want = ReadJsonl(single);
  ASSERT_EQ(want.size(), static_cast<size_t>(n + 1));
  for (const char* by : {"line", "id"}) {
    for (int shards : {1, 3, 4}) {
      SCOPED_TRACE(std::string(by) + " " + std::to_string(shards));
      std::vector<std::string> merge = {"score", "--merge"};
      int64_t total = 0;
      for (int s = 0; s < shards; ++s) {
        const std::string out = dir.File(std::string(by) + std::to_string(shards) + "." + std::to_string(s));
        const std::vector<std::string> shard = {"--shard", std::to_string(s) + "/" + std::to_string(shards),
                                                "--shard-by", by};
        if (s == 1) score(out, shard, 40);  // killed early (maybe before any output), resumed below
        const int rc = score(out, shard);
        EXPECT_TRUE(rc == 0 || rc == 1) << rc;
        total += static_cast<int64_t>(ReadJsonl(out).size());
        merge.push_back(out);
      }
      EXPECT_EQ(total, n + 1);
      const std::string all = dir.File(std::string("all.") + by + std::to_string(shards));
      merge.insert(merge.end(), {"--input", in, "-o", all});
      EXPECT_EQ(RunCli(merge), 1);  // merged; exit 1: some lines are errors
      const std::vector<json> got = ReadJsonl(all);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) ExpectSameJson(got[i], want[i], "line " + std::to_string(i));
    }
  }
  // The repeated id's error line names its line; the id-less line too.
  EXPECT_EQ(want[7]["line"], 8);
  EXPECT_EQ(want[11]["line"], 13);  // physical line 13: after the blank line 11
  EXPECT_NE(want[11]["error"].get<std::string>().find("duplicate id \"s2\""), std::string::npos);
}

TEST(Score, BadShardsAndMergesFailBeforeWork) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), out = dir.File("out.jsonl");
  WriteFile(in, ShardInput(12));
  for (const char* spec : {"3/3", "1-3", "-1/3", "0/0", "x"}) {
    EXPECT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", out, "--shard", spec}), 1) << spec;
    EXPECT_FALSE(std::ifstream(out).good()) << spec << ": output created";
  }
  EXPECT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", out, "--shard", "0/2", "--shard-by", "x"}), 1);
  EXPECT_EQ(RunCli({"score", "--input", in, "--output", out}), 1);  // no model
  // A merge missing a shard: exit 1, nothing written.
  const std::string s0 = dir.File("s0.jsonl"), s1 = dir.File("s1.jsonl"), all = dir.File("all.jsonl");
  ASSERT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", s0, "--shard", "0/2", "-t", "1"}), 1);
  EXPECT_EQ(RunCli({"score", "--merge", s0, "--input", in, "-o", all}), 1);
  EXPECT_FALSE(std::ifstream(all).good());
  // Both shards, then the same file twice.
  ASSERT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", s1, "--shard", "1/2", "-t", "1"}), 1);
  EXPECT_EQ(RunCli({"score", "--merge", s0, s1, s1, "--input", in, "-o", all}), 1);
  EXPECT_FALSE(std::ifstream(all).good());
  EXPECT_EQ(RunCli({"score", "--merge", s0, s1, "--input", in, "-o", all}), 1);  // lines with errors
  EXPECT_EQ(ReadJsonl(all).size(), 12u);
}

// ---- eval ----

struct Tok {
  std::unique_ptr<Tokenizer> t;
  Tok() {
    auto f = GgufFile::Open(kModel, {.mmap = false});
    EXPECT_TRUE(f.ok());
    auto r = Tokenizer::FromGguf(**f);
    EXPECT_TRUE(r.ok());
    t = std::move(*r);
  }
  std::vector<int32_t> operator()(const std::string& s) const { return t->Encode(s, true, false); }
};

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

json RunEval(const std::string& task, const std::string& file, std::vector<std::string> extra = {}) {
  ScratchDir dir;
  const std::string out = dir.File("eval.json");
  std::vector<std::string> args = {"eval", "--task", task, "-m", kModel, file, "--json", "-t", "2", "--batch-tokens", "200"};
  args.insert(args.end(), extra.begin(), extra.end());
  EXPECT_EQ(RunCli(args, -1, out), 0);
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

const char* kWords[] = {"the cat", "a dog", "ran far", "sat down", "green tea", "old man", "blue sky", "hot sun",
                        "on the mat", "in the park", "at home", "by the sea", "with a hat", "under a tree"};

TEST(Eval, Hellaswag) {
  ScratchDir dir;
  const std::string file = dir.File("hs.txt");
  auto e = Engine::Load(kModel, {.n_threads = 2});
  ASSERT_TRUE(e.ok());
  Tok tok;
  std::string text;
  const int n = 12;
  std::vector<int> predicted(n);
  std::vector<std::vector<double>> scores(n);
  for (int t = 0; t < n; ++t) {
    const std::string ctx = std::string("Story ") + kWords[t % 14] + " and " + kWords[(t + 3) % 14] + ":";
    std::vector<std::string> endings;
    std::vector<std::vector<int32_t>> seqs;
    for (int k = 0; k < 4; ++k) {
      endings.push_back(std::string(kWords[(t + k * 5) % 14]) + " " + kWords[(t * 3 + k) % 14] + ".");
      seqs.push_back(tok(ctx + " " + endings.back()));
    }
    scores[t] = MeanScores(**e, seqs);
    predicted[t] = Best(scores[t]);
    const int gold = t % 3 == 0 ? (predicted[t] + 1) % 4 : predicted[t];  // 8 of 12 correct
    text += ctx + "\n" + std::to_string(gold) + "\n";
    for (const std::string& s : endings) text += s + "\n";
  }
  WriteFile(file, text);
  const json j = RunEval("hellaswag", file);
  EXPECT_EQ(j["n_tasks"], n);
  EXPECT_EQ(j["n_correct"], 8);
  EXPECT_NEAR(j["accuracy"].get<double>(), 100.0 * 8 / 12, 1e-9);
  EXPECT_NEAR(j["stderr"].get<double>(), 100.0 * std::sqrt((8.0 / 12) * (4.0 / 12) / 11), 1e-9);
  for (const json& it : j["items"]) {
    const int t = it["index"];
    EXPECT_EQ(it["predicted"], predicted[t]) << t;
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(it["scores"][k].get<double>(), scores[t][k], 1e-5) << t;
  }
  // --tasks N keeps N tasks (llama.cpp's random pick), bad files are refused with one line.
  const json five = RunEval("hellaswag", file, {"--tasks", "5"});
  EXPECT_EQ(five["items"].size(), 5u);
  for (const json& it : five["items"]) EXPECT_EQ(it["predicted"], predicted[it["index"].get<int>()]);
  WriteFile(file, "only\nfive\nlines\nhere\nnow\n");
  EXPECT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file}), 1);
}

TEST(Eval, Winogrande) {
  ScratchDir dir;
  const std::string file = dir.File("wg.csv");
  auto e = Engine::Load(kModel, {.n_threads = 2});
  ASSERT_TRUE(e.ok());
  Tok tok;
  std::string text = "index,sentence,option1,option2,answer\n";  // a header: skipped (answer not 1/2)
  const int n = 10;
  int correct = 0;
  std::vector<int> predicted(n);
  for (int t = 0; t < n; ++t) {
    // Long tails (partial scoring) for most, a short one for t % 4 == 3.
    const std::string tail = t % 4 == 3 ? std::string(".") : std::string(" was ") + kWords[(t + 2) % 14] + " " +
                                                                   kWords[(t + 6) % 14] + " again.";
    const std::string sentence = std::string("When ") + kWords[t % 14] + " met _" + tail;
    const std::string c[2] = {kWords[(t + 1) % 14], kWords[(t + 9) % 14]};
    std::vector<std::vector<int32_t>> seqs;
    std::vector<size_t> base;
    const size_t blank = sentence.find('_');
    for (const std::string& ch : c) {
      seqs.push_back(tok(sentence.substr(0, blank) + ch + sentence.substr(blank + 1)));
      base.push_back(tok(sentence.substr(0, blank) + ch).size());
    }
    const size_t cp = CommonPrefix(seqs);
    const bool partial = seqs[0].size() - cp > 3 && seqs[1].size() - cp > 3;
    double sc[2];
    for (int s = 0; s < 2; ++s) {
      const std::vector<double> lp = Logprobs(**e, seqs[s]);
      const size_t b = partial ? base[s] : cp;
      const size_t last = seqs[s].size() - b > 1 ? 1 : 0;
      double sum = 0;
      for (size_t p = b; p < seqs[s].size() - last; ++p) sum += lp[p];
      sc[s] = sum / static_cast<double>(seqs[s].size() - b - last);
    }
    predicted[t] = sc[0] > sc[1] ? 0 : 1;
    const int answer = t % 2 == 0 ? predicted[t] + 1 : 2 - predicted[t];  // even: right, odd: wrong
    correct += t % 2 == 0;
    const bool quote = t % 3 == 0;
    text += std::to_string(t) + "," + (quote ? "\"" + sentence + "\"" : sentence) + "," + c[0] + "," + c[1] + "," +
            std::to_string(answer) + "\n";
  }
  WriteFile(file, text);
  const json j = RunEval("winogrande", file);
  EXPECT_EQ(j["n_tasks"], n);
  EXPECT_EQ(j["n_correct"], correct);
  for (const json& it : j["items"]) EXPECT_EQ(it["predicted"], predicted[it["index"].get<int>()]) << it.dump();
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

TEST(Eval, MultipleChoice) {
  ScratchDir dir;
  const std::string file = dir.File("mc.bin");
  auto e = Engine::Load(kModel, {.n_threads = 2});
  ASSERT_TRUE(e.ok());
  Tok tok;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> tasks;
  int correct = 0;
  for (int t = 0; t < 9; ++t) {
    const std::string q = std::string("Question: where is ") + kWords[t % 14] + "? Answer:";
    const int n_ans = 2 + t % 4;
    std::vector<std::vector<int32_t>> seqs;
    std::vector<std::string> answers;
    for (int a = 0; a < n_ans; ++a) {
      answers.push_back(kWords[(t + 4 * a + 1) % 14]);
      seqs.push_back(tok(q + " " + answers.back()));
    }
    const int best = Best(MeanScores(**e, seqs));
    const int right = t % 3 == 1 ? (best + 1) % n_ans : best;
    correct += right == best;
    std::vector<std::pair<std::string, int>> as;
    for (int a = 0; a < n_ans; ++a) as.push_back({answers[a], a == right ? 1 : 0});
    tasks.push_back({q, as});
  }
  WriteFile(file, McFile(tasks));
  const json j = RunEval("multiple-choice", file);
  EXPECT_EQ(j["n_tasks"], 9);
  EXPECT_EQ(j["n_correct"], correct);
  // Truncated file: one-line error, exit 1.
  std::string bytes = McFile(tasks);
  WriteFile(file, bytes.substr(0, bytes.size() - 7));
  EXPECT_EQ(RunCli({"eval", "--task", "multiple-choice", "-m", kModel, file}), 1);
}

}  // namespace
}  // namespace estream

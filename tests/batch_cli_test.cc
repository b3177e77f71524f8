// The CLI smoke tests of `estream score` and `estream eval` (the workflows themselves are tested
// through the library in batch_test.cc):
//  - score resume: runs killed (SIGKILL) at random points, plus a torn last line, then completed:
//    every id exactly once, results equal an uninterrupted run's;
//  - score refuses bad flags before any work (no output file);
//  - eval: exit status 0 and the library's JSON on a good file, 1 with a one-line error on a bad one.
// Nothing is timed (the kill delays are random, only the results are checked).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "batch/eval.h"
#include "batch_test_util.h"
#include "cli_test_util.h"
#include "estream/engine.h"
#include "scratch_dir.h"

extern char** environ;

namespace estream {
namespace {

using namespace batch_test;  // NOLINT
using test_util::ScratchDir;

const std::string kCli = ESTREAM_CLI;

// Runs the CLI with `args`; returns the exit status (-signal when killed). kill_after_ms >= 0:
// SIGKILL it after that many milliseconds if it is still running. stdout and stderr go to the
// files given (else /dev/null); vm_limit_kb > 0: under `ulimit -v` of that many KiB.
int RunCli(const std::vector<std::string>& args, int kill_after_ms = -1, const std::string& stdout_path = "",
           const std::string& stderr_path = "", int64_t vm_limit_kb = 0) {
  std::vector<std::string> all = {kCli};
  if (vm_limit_kb > 0)
    all = {"/bin/sh", "-c", "ulimit -v " + std::to_string(vm_limit_kb) + " && exec \"$0\" \"$@\"", kCli};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.empty() ? "/dev/null" : stdout_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, stderr_path.empty() ? "/dev/null" : stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  if (kill_after_ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kill_after_ms));
    kill(pid, SIGKILL);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

TEST(Score, CliResumeAfterKillsAndTornLine) {
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

TEST(Score, CliRefusesBadFlagsBeforeWork) {
  ScratchDir dir;
  const std::string in = dir.File("in.jsonl"), out = dir.File("out.jsonl");
  WriteFile(in, ShardInput(12));
  for (const char* spec : {"3/3", "x"})
    EXPECT_EQ(RunCli({"score", "-m", kModel, "--input", in, "--output", out, "--shard", spec}), 1) << spec;
  EXPECT_EQ(RunCli({"score", "--input", in, "--output", out}), 1);  // no model
  EXPECT_FALSE(std::ifstream(out).good());
}

TEST(Eval, CliExitStatusAndJson) {
  ScratchDir dir;
  const std::string file = dir.File("hs.txt"), out = dir.File("eval.json");
  std::string text;
  for (int t = 0; t < 3; ++t) {
    text += "The story " + std::to_string(t) + " begins:\n" + std::to_string(t) + "\n";
    for (const char* e : {"a cat sat.", "a dog ran.", "the sun set.", "the tea cooled."}) text += std::string(e) + "\n";
  }
  WriteFile(file, text);
  ASSERT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file, "--json", "-t", "2"}, -1, out), 0);
  const json got = json::parse(ReadFile(out));
  // The library's result for the same file.
  auto tok = ModelTokenizer();
  auto tasks = batch::LoadTasks(batch::EvalKind::kHellaswag, text, *tok);
  ASSERT_TRUE(tasks.ok());
  auto e = Engine::Load(kModel, {.n_threads = 2});
  ASSERT_TRUE(e.ok());
  auto r = batch::Evaluate(**e, batch::EvalKind::kHellaswag, *tasks);
  ASSERT_TRUE(r.ok());
  r->model = kModel;
  r->file = file;
  json want = json::parse(batch::EvalJson(*r));
  want["forward_seconds"] = got["forward_seconds"];  // the one figure that differs run to run
  ExpectSameJson(got, want, "eval");
  // A bad file: exit 1.
  WriteFile(file, "only\nfive\nlines\nhere\nnow\n");
  EXPECT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file}), 1);
}

// A path that is not valid UTF-8 (a Latin-1 file name): the JSON writes U+FFFD for the bad byte
// instead of aborting at the end of the run (nlohmann's dump threw type_error.316).
TEST(Eval, CliJsonWithAPathThatIsNotUtf8) {
  ScratchDir dir;
  const std::string file = dir.File("hs_\xff.txt"), out = dir.File("eval.json");
  std::string text = "The story begins:\n1\n";
  for (const char* e : {"a cat sat.", "a dog ran.", "the sun set.", "the tea cooled."}) text += std::string(e) + "\n";
  WriteFile(file, text);
  ASSERT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file, "--json", "-t", "2"}, -1, out), 0);
  const json got = json::parse(ReadFile(out));
  EXPECT_EQ(got["file"], dir.File("hs_\xEF\xBF\xBD.txt"));
  EXPECT_EQ(got["n_tasks"], 1);
}

// A hellaswag file of n tasks of about 150 tokens each on the tiny vocabularies (random words).
std::string HellaswagFile(int n) {
  const char* words[] = {"the", "man", "dog", "runs", "over", "green", "house", "quickly", "eats", "blue", "car"};
  std::mt19937 rng(7);
  auto phrase = [&](int k) {
    std::string s;
    for (int i = 0; i < k; ++i) s += std::string(i ? " " : "") + words[rng() % 11];
    return s;
  };
  std::string text;
  for (int t = 0; t < n; ++t) {
    text += phrase(20) + "\n" + std::to_string(t % 4) + "\n";
    for (int e = 0; e < 4; ++e) text += phrase(5) + ".\n";
  }
  return text;
}

// A winogrande task that fails names its line in the file (a skipped line before it makes the
// task count differ from the line number), on stderr and in the JSON.
TEST(Eval, CliTaskErrorsNameTheFileLine) {
  ScratchDir dir;
  const std::string file = dir.File("wg.csv"), out = dir.File("eval.json"), err = dir.File("stderr.txt");
  std::string too_long = "When the cat";
  for (int i = 0; i < 3000; ++i) too_long += " sat";  // past the context (4096 tokens)
  WriteFile(file, "index,sentence,option1,option2,answer\n"
                  "0,When the cat met _ it sat.,the dog,the sun,1\n"
                  "1,not a task line\n"
                  "2," + too_long + " near _ again.,the dog,the sun,2\n"
                  "3,When the dog met _ it ran.,the cat,the moon,1\n"
                  "4,The last line is not scored _.,a,b,1\n");
  EXPECT_EQ(RunCli({"eval", "--task", "winogrande", "-m", kModel, file, "--json", "-t", "1"}, -1, out, err), 1);
  const std::string e = ReadFile(err);
  EXPECT_NE(e.find("estream eval: task 1 (" + file + " line 4): prompt of "), std::string::npos) << e;
  const json got = json::parse(ReadFile(out));
  ASSERT_EQ(got["items"].size(), 3u);
  EXPECT_EQ(got["items"][1]["index"], 1);
  EXPECT_EQ(got["items"][1]["line"], 4);
  EXPECT_TRUE(got["items"][1].contains("error"));
  EXPECT_EQ(got["items"][2]["line"], 5);
}

// Progress on stderr: not a terminal here, so plain lines, the last at 100%; none with
// --no-progress. (Nothing is timed: only the lines' presence and counts are checked.)
TEST(Eval, CliProgressLinesAndNoProgress) {
  ScratchDir dir;
  const std::string file = dir.File("hs.txt"), err = dir.File("stderr.txt");
  WriteFile(file, HellaswagFile(40));
  ASSERT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file, "-t", "1", "--batch-tokens", "400"}, -1, "",
                   err), 0);
  const std::string e = ReadFile(err);
  EXPECT_NE(e.find("estream eval: 40/40 tasks (100%), "), std::string::npos) << e;
  EXPECT_GE(std::count(e.begin(), e.end(), '\n'), 3) << e;  // several windows: several tenths
  EXPECT_LE(std::count(e.begin(), e.end(), '\n'), 10) << e;  // at most one line per tenth
  ASSERT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file, "-t", "1", "--no-progress"}, -1, "", err), 0);
  EXPECT_EQ(ReadFile(err), "");
}

// Without --batch-tokens, eval packs 8192 tokens per pass, not the context length (163840 for
// DeepSeek-V2, whose engine pass_tokens() is that): a task file no longer runs as one pass whose
// activations are sized for all of it. --batch-tokens still sets the pass. (The batch_tokens
// error's own wording, for a pass that cannot be allocated: the next test.)
TEST(Eval, CliDefaultPassIsBoundedNotTheContext) {
  ScratchDir dir;
  const std::string file = dir.File("hs.txt"), out = dir.File("eval.json");
  const std::string model = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/deepseek2-tiny-f32.gguf";
  WriteFile(file, HellaswagFile(80));
  ASSERT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", model, file, "--json", "-t", "1"}, -1, out), 0);
  json got = json::parse(ReadFile(out));
  ASSERT_GT(got["tokens"].get<int64_t>(), 8192);
  EXPECT_LE(got["longest_pass"].get<int64_t>(), 8192);
  EXPECT_GE(got["passes"].get<int64_t>(), 2);
  // A quarter of the tasks (CI's time) with a pass of 1000 tokens.
  WriteFile(file, HellaswagFile(20));
  ASSERT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", model, file, "--json", "-t", "1", "--batch-tokens", "1000"},
                   -1, out), 0);
  got = json::parse(ReadFile(out));
  ASSERT_GT(got["tokens"].get<int64_t>(), 2000);
  EXPECT_LE(got["longest_pass"].get<int64_t>(), 1000);
  EXPECT_GE(got["passes"].get<int64_t>(), 3);
}

// A pass of many tasks whose activations do not fit (ulimit -v): the error says to lower
// --batch-tokens, not to shorten a prompt (every prompt is short).
TEST(Eval, CliPassTooLargeForMemorySaysLowerBatchTokens) {
  if (cli_test::kAddressSanitizer) GTEST_SKIP() << "ulimit -v does not work with AddressSanitizer's shadow memory";
  ScratchDir dir;
  const std::string file = dir.File("hs.txt"), err = dir.File("stderr.txt");
  WriteFile(file, HellaswagFile(300));
  EXPECT_EQ(RunCli({"eval", "--task", "hellaswag", "-m", kModel, file, "-t", "1", "--batch-tokens", "163840",
                    "--no-progress"}, -1,
                   dir.File("stdout.txt"), err, /*vm_limit_kb=*/300 << 10),
            1);
  const std::string e = ReadFile(err);
  EXPECT_NE(e.find("requests packed together); lower batch_tokens (--batch-tokens) or free memory"),
            std::string::npos) << e;
  EXPECT_EQ(e.find("shorter prompt"), std::string::npos) << e;
  EXPECT_EQ(ReadFile(dir.File("stdout.txt")), "hellaswag: no task was scored: all 300 failed (see stderr)\n");
  // 300 tasks failed alike: 10 lines, then the count (not 300 lines).
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 11) << e;
  EXPECT_NE(e.find("estream eval: 290 more tasks failed (not shown; --json gives every task's error)\n"),
            std::string::npos) << e;
}

}  // namespace
}  // namespace estream

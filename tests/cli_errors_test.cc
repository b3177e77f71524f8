// The CLI's error contract (docs/GUIDE.md section 8) for mistakes on the command line: every
// error is one line on stderr, "estream <command>: error: ..." (or "estream: error: ..." before
// a command is known), exit code 1, and names what to change. Runs the built binary on a tiny
// model that the test makes with `estream synth` and `estream pack`.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_test_util.h"

namespace estream {
namespace {

using cli_test::CliResult;

class CliErrors : public cli_test::TinyModelCli {
 protected:
  // `args` fails with exit code 1 and one stderr line that starts with `prefix` and holds `what`.
  static void ExpectError(const std::string& args, const std::string& prefix, const std::string& what,
                          const std::string& shell_prefix = "") {
    const CliResult r = Run(args, shell_prefix);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << "\n" << r.err;
  }
};

TEST_F(CliErrors, CommandLineMistakesAreOneLineAndExitCode1) {
  ExpectError("frob", "estream: error: unknown command 'frob'", "prefill");
  ExpectError("", "estream: error: ", "give a command");
  ExpectError("prefill -m " + Model() + " -p hi --bogus", "estream prefill: error: ", "--bogus");
  ExpectError("prefill -p hi", "estream prefill: error: ", "--model");
  ExpectError("prefill -m " + Model() + " -p hi -t 100000", "estream prefill: error: ", "--threads");
  ExpectError("synth --layers 0 -o " + dir_->File("x.gguf"), "estream synth: error: ", "--layers");
  {  // a prompt past the tiny model's 4096-token context: what to do, not only what is wrong
    std::ofstream ids(dir_->File("long_ids.txt"));
    for (int i = 0; i < 4097; ++i) ids << (i ? "," : "") << 1 + i % 500;
  }
  ExpectError("prefill -m " + Model() + " --tokens @" + dir_->File("long_ids.txt"), "estream prefill: error: ",
              "prompt of 4097 tokens is longer than the model's context length 4096: shorten it");
  // Thread counts are bounded by kMaxThreads everywhere (synth --threads 100000 crashed in
  // GOMP_parallel and left its temporary file).
  ExpectError("synth --threads 100000 -o " + dir_->File("x.gguf"), "estream synth: error: ", "--threads");
  ExpectError("pack -t 1025 " + Model() + " -o " + dir_->File("x.gguf"), "estream pack: error: ", "--threads");
  ExpectError("serve -m " + Model() + " -t 1025", "estream serve: error: ", "--threads");
  ExpectError("serve -m " + Model() + " --http-threads 100000", "estream serve: error: ", "--http-threads");
  // Integer flags: what is wanted, in one short line (CLI11's own check printed DBL_MAX in full).
  ExpectError("eval --task hellaswag -m " + Model() + " f.txt --tasks 0", "estream eval: error: ",
              "--tasks: expected a positive integer, got '0'");
  ExpectError("prefill -m " + Model() + " -p hi --top-k abc", "estream prefill: error: ",
              "--top-k: expected an integer >= 0, got 'abc'");
  ExpectError("eval --task hellaswag -m " + Model() + " " + dir_->path(), "estream eval: error: ", "is a directory");
  EXPECT_FALSE(std::ifstream(dir_->File("x.gguf")).good());
  // --help and --version still print and succeed.
  EXPECT_EQ(Run("prefill --help").exit_code, 0);
  EXPECT_EQ(Run("--version").exit_code, 0);
}

TEST_F(CliErrors, SizesOutOfRangeAreRefused) {
  ExpectError("prefill -m " + Packed() + " -p hi --budget 16777216T", "estream prefill: error: ", "too large");
  ExpectError("prefill -m " + Packed() + " -p hi --budget nan", "estream prefill: error: ", "bad size 'nan'");
  ExpectError("prefill -m " + Packed() + " -p hi --budget 1G --expert-cache lots", "estream prefill: error: ",
              "or auto");
  // An empty or zero budget is an error everywhere, not "no budget" (it ran all-resident).
  for (const std::string& cmd : {"prefill -m " + Packed() + " -p hi", "profile " + Packed(), "sweep " + Packed(),
                                "score -m " + Packed() + " --input x.jsonl -o y.jsonl", "serve -m " + Packed()}) {
    ExpectError(cmd + " --budget ''", "estream " + cmd.substr(0, cmd.find(' ')) + ": error: ", "--budget: empty size");
    ExpectError(cmd + " --budget 0", "estream " + cmd.substr(0, cmd.find(' ')) + ": error: ", "must be positive");
  }
  ExpectError("bench -m " + Packed() + " --budgets ''", "estream bench: error: ", "--budgets: empty size");
  // Sizes are decimal: no hexadecimal (0x100M read as 256 MiB), exponents, signs or spaces.
  for (const char* bad : {"0x100M", "1e9", "-1G", "+1G", "' 1G'", "1.5.1G", "1GG", ".G"})
    ExpectError("prefill -m " + Packed() + " -p hi --budget " + bad, "estream prefill: error: ", "bad size");
}

// Outputs renamed into place (pack, synth, score --merge) refuse a FIFO or a device before any
// work: the rename would replace it with a regular file (as root, `pack -o /dev/null` did).
TEST_F(CliErrors, OutputsThatAreNotRegularFilesAreRefused) {
  const std::string fifo = dir_->File("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ExpectError("pack -q " + Model() + " -o " + fifo, "estream pack: error: ", fifo + " is a FIFO");
  ExpectError("synth -q --preset tiny -o " + fifo, "estream synth: error: ", fifo + " is a FIFO");
  std::ofstream(dir_->File("shard.jsonl")) << "{\"id\": 1, \"n_tokens\": 3}\n";
  ExpectError("score --merge " + dir_->File("shard.jsonl") + " -o " + fifo, "estream score: error: ",
              fifo + " is a FIFO");
  const std::string null = dir_->File("null");
  if (::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {  // root only
    ExpectError("pack -q " + Model() + " -o " + null, "estream pack: error: ", null + " is a character device");
    struct stat st;
    ASSERT_EQ(::lstat(null.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
  }
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  for (const std::string& name : dir_->List()) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

// pack runs the loader's checks on its source first: a model prefill would refuse is refused by
// pack with the same message (it used to be packed, and prefill then said "re-pack the model").
TEST_F(CliErrors, PackRefusesWhatPrefillRefuses) {
  std::string bytes;
  {
    std::ifstream in(Model(), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string key = "olmoe.attention.head_count";
  std::string pattern(8, '\0');
  pattern[0] = static_cast<char>(key.size());
  pattern += key + std::string("\x04\0\0\0", 4);  // the u32 key, not head_count_kv
  const size_t at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + pattern.size(), 4, std::string(4, '\0'));
  const std::string bad = dir_->File("head_count_0.gguf");
  std::ofstream(bad, std::ios::binary) << bytes;
  const std::string why = "attention.head_count/head_count_kv/context_length must be positive";
  ExpectError("prefill -m " + bad + " --tokens 1,2", "estream prefill: error: ", why);
  ExpectError("pack -q " + bad + " -o " + dir_->File("never.gguf"), "estream pack: error: ", why);
  EXPECT_FALSE(std::ifstream(dir_->File("never.gguf")).good());
}

// A FIFO given as the model is refused at once (the open used to wait for a writer forever), an
// output path that cannot be written is refused before the work (bench ran every benchmark
// first), and a budget that per-thread scratch overflows says so and how many threads fit.
TEST_F(CliErrors, FifoModelsUnwritableOutputsAndThreadHungryBudgets) {
  const std::string fifo = dir_->File("model.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& cmd : {"prefill -m " + fifo + " --tokens 1,2", "inspect " + fifo, "pack -q " + fifo + " -o " +
                                dir_->File("p.gguf"), "profile " + fifo + " --budget 1G"})
    ExpectError(cmd, "estream " + cmd.substr(0, cmd.find(' ')) + ": error: ", fifo + ": not a regular file (a FIFO)");
  const CliResult bench = Run("bench -m " + Packed() + " --prompt-lengths 4 --json " + dir_->File("no/such/x.json"));
  EXPECT_EQ(bench.exit_code, 1);
  EXPECT_EQ(bench.out, "") << "nothing may run first";
  EXPECT_NE(bench.err.find("--json " + dir_->File("no/such/x.json") + ": cannot create"), std::string::npos)
      << bench.err;
  ExpectError("bench -m " + Packed() + " --prompt-lengths 4 --csv " + dir_->path(), "estream bench: error: ",
              "--csv " + dir_->path() + " is a directory");
  ExpectError("prefill -m " + Packed() + " --tokens 1,2 -t 1024 --budget 200M", "estream prefill: error: ",
              "at 1024 threads");
  ExpectError("prefill -m " + Packed() + " --tokens 1,2 -t 1024 --budget 200M", "estream prefill: error: ",
              "use fewer threads (up to ");
}

TEST_F(CliErrors, MissingModelAndTraceProblemsAreNamed) {
  // A text prompt with a model that cannot be opened: the open error, not a tokenizer hint.
  const CliResult r = Run("prefill -m " + dir_->File("nope.gguf") + " -p hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope.gguf: cannot open"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tokenizer"), std::string::npos) << r.err;
  ExpectError("prefill -m " + Model() + " -p hi --trace " + dir_->File("t.json"), "estream prefill: error: ",
              "is not packed");
  ExpectError("prefill -m " + Packed() + " -p hi --budget 100M --trace " + dir_->File("no/such/dir/t.json"),
              "estream prefill: error: ", "cannot create");
  ASSERT_EQ(Run("prefill -m " + Packed() + " -p hi --budget 100M --trace " + dir_->File("t.json")).exit_code, 0);
  EXPECT_TRUE(std::ifstream(dir_->File("t.json")).good());
}

TEST_F(CliErrors, ModelGivenTwiceOrNotAtAll) {
  // profile and sweep take the model as MODEL or -m MODEL: one of the two, or both the same.
  for (const std::string cmd : {"profile", "sweep"}) {
    ExpectError(cmd + " --budget 100M", "estream " + cmd + ": error: ", "give the model: MODEL or -m MODEL");
    ExpectError(cmd + " " + Packed() + " -m " + Model() + " --budget 100M", "estream " + cmd + ": error: ",
                "two models given");
    // The same path twice is accepted: the command goes on to its next check (the budget).
    ExpectError(cmd + " " + Packed() + " -m " + Packed() + " --budget 0", "estream " + cmd + ": error: ",
                "a memory budget must be positive");
    const CliResult help = Run(cmd + " --help");
    // Only --budget is marked REQUIRED (CLI11 marked both MODEL and -m, of which one is).
    const size_t required = help.out.find("REQUIRED");
    EXPECT_NE(help.out.find("--budget TEXT:SIZE REQUIRED"), std::string::npos) << help.out;
    EXPECT_EQ(help.out.find("REQUIRED", required + 1), std::string::npos) << help.out;
    EXPECT_NE(help.out.find("one of the two is required"), std::string::npos) << help.out;
  }
}

TEST_F(CliErrors, ABareBudgetNumberIsBytesAndSaysSo) {
  ExpectError("prefill -m " + Packed() + " -p hi --budget 600", "estream prefill: error: ",
              "memory budget 600 bytes (a size without a K/M/G/T suffix counts bytes");
}

TEST_F(CliErrors, ScoreOutputMustBeARegularFile) {
  std::ofstream(dir_->File("in.jsonl")) << "{\"id\": 1, \"prompt\": \"hi\"}\n";
  ExpectError("score -m " + Model() + " --input " + dir_->File("in.jsonl") + " --output " + dir_->path() +
                  " --no-progress",
              "estream score: error: ", dir_->path() + " is not a regular file");
}

TEST_F(CliErrors, ServeFailsBeforeListeningWhenTheModelCannotBeOpened) {
  const CliResult r = Run("serve -m " + dir_->File("nope.gguf") + " --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.find("listening"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.rfind("estream serve: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("nope.gguf: cannot open"), std::string::npos) << r.err;
}

TEST_F(CliErrors, FailedRunsAndEmptyInputsSetTheExitCode) {
  // bench: every run failing (a budget below the minimum) -> exit 1, the row says why.
  const CliResult b = Run("bench -m " + Packed() + " --prompt-lengths 16 --budgets 1M");
  EXPECT_EQ(b.exit_code, 1) << b.out << b.err;
  EXPECT_NE(b.out.find("too small"), std::string::npos) << b.out;
  // eval on a file without tasks.
  std::ofstream(dir_->File("empty.txt")).flush();
  ExpectError("eval --task hellaswag -m " + Model() + " " + dir_->File("empty.txt"), "estream eval: error: ",
              "no hellaswag tasks");
}

// Input files (eval's FILE, perplexity's and tokenize's -f) are read whole: a device that never
// ends (/dev/zero) is refused before reading, a file over the 1 GiB cap is refused by its size
// (a sparse file: nothing is written), and memory that runs out while reading one is one line,
// not an uncaught std::bad_alloc (exit 134).
TEST_F(CliErrors, InputFilesAreBoundedAndOutOfMemoryIsOneLine) {
  const std::string m = " -m " + Model() + " ";
  ExpectError("eval --task hellaswag" + m + "/dev/zero", "estream eval: error: ", "/dev/zero is not a regular file");
  ExpectError("perplexity" + m + "-f /dev/zero", "estream perplexity: error: ", "/dev/zero is not a regular file");
  ExpectError("tokenize" + m + "-f /dev/zero", "estream tokenize: error: ", "/dev/zero is not a regular file");
  const std::string big = dir_->File("big.txt");
  std::ofstream(big).flush();
  std::filesystem::resize_file(big, (uint64_t{1} << 30) + 1);
  ExpectError("eval --task winogrande" + m + big, "estream eval: error: ",
              "big.txt is larger than 1.00 GiB, the most estream reads as a text or task file");
  ExpectError("tokenize" + m + "-f " + big, "estream tokenize: error: ", "is larger than 1.00 GiB");
  if (!cli_test::kAddressSanitizer) {  // its shadow memory does not fit under ulimit -v
    std::filesystem::resize_file(big, uint64_t{600} << 20);
    ExpectError("tokenize" + m + "-f " + big, "estream tokenize: error: ", "out of memory", "ulimit -v 400000; ");
  }
  std::filesystem::remove(big);
}

}  // namespace
}  // namespace estream

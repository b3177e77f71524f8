// End-to-end tests of `estream tokenize` and `estream perplexity` (runs the built CLI).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "gguf/gguf.h"
#include "pack/metadata_update.h"

namespace estream {
namespace {

namespace fs = std::filesystem;

const fs::path kBin = fs::path(ESTREAM_BINARY_DIR);
const fs::path kCli = kBin / "tools" / "estream" / "estream";
const fs::path kTok = fs::path(ESTREAM_SHARED_DIR) / "testdata" / "tokenizer";
const fs::path kModels = fs::path(ESTREAM_SHARED_DIR) / "testdata" / "models";

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct CliRun {
  int rc = -1;
  std::string out, err;
};

// Runs `estream ARGS` (args are shell-quoted by the caller) and captures stdout and stderr.
// Engine runs use one thread: the CI machine is shared and OpenMP barriers stall under load.
CliRun Estream(const std::string& args) {
  // Unique per process and call: ctest may run these tests in parallel processes.
  static int counter = 0;
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(counter++);
  const fs::path out = kBin / ("tokenizer_cli_test_" + tag + ".out");
  const fs::path err = kBin / ("tokenizer_cli_test_" + tag + ".err");
  const std::string cmd = "'" + kCli.string() + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  CliRun r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = Slurp(out);
  r.err = Slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

std::string Q(const fs::path& p) { return "'" + p.string() + "'"; }

TEST(TokenizeCli, JsonIdsAndPieces) {
  ASSERT_TRUE(fs::exists(kCli)) << kCli;
  CliRun r = Estream("tokenize -m " + Q(kTok / "ggml-vocab-qwen3.gguf") + " -p 'Hello world' --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"], nlohmann::json({9707, 1879}));
  EXPECT_EQ(j["pieces"], nlohmann::json({"Hello", " world"}));
}

TEST(TokenizeCli, BosPerMetadataAndNoBos) {
  const std::string spm = Q(kTok / "ggml-vocab-llama-spm.gguf");
  CliRun r = Estream("tokenize -m " + spm + " -p 'Hello world' --ids");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "1 15043 3186\n");
  r = Estream("tokenize -m " + spm + " -p 'Hello world' --ids --no-bos");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "15043 3186\n");
}

TEST(TokenizeCli, TextFromFileAndInvalidUtf8Warning) {
  const fs::path in = kBin / ("tokenizer_cli_test_input_" + std::to_string(getpid()) + ".txt");
  std::ofstream(in, std::ios::binary) << "caf\xC3\xA9\n\xFF";
  CliRun r = Estream("tokenize -m " + Q(kTok / "ggml-vocab-gpt-2.gguf") + " -f " + Q(in) + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("not valid UTF-8"), std::string::npos) << r.err;
  fs::remove(in);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["ids"].size(), 3u);
}

// A byte token cuts a character, so its piece is not valid UTF-8 (JSON shows U+FFFD): "bytes"
// gives its raw bytes (null for the others), and the pieces join back into the text.
TEST(TokenizeCli, JsonBytesOfPiecesThatAreNotUtf8) {
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80 ok";  // the emoji is split into byte tokens
  // llama's pieces carry the space Encode puts before the text (its add_space_prefix).
  const std::pair<const char*, const char*> vocabs[] = {{"ggml-vocab-gpt-2.gguf", ""},
                                                        {"ggml-vocab-llama-spm.gguf", " "}};
  for (const auto& [vocab, prefix] : vocabs) {
    CliRun r = Estream("tokenize -m " + Q(kTok / vocab) + " -p '" + text + "' --json --no-bos");
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["bytes"].size(), j["ids"].size()) << vocab;
    std::string joined;
    int byte_pieces = 0;
    for (size_t i = 0; i < j["ids"].size(); ++i) {
      if (j["bytes"][i].is_null()) {
        joined += j["pieces"][i].get<std::string>();
        continue;
      }
      ++byte_pieces;
      for (int b : j["bytes"][i]) joined.push_back(static_cast<char>(b));
    }
    EXPECT_GT(byte_pieces, 0) << vocab;
    EXPECT_EQ(joined, prefix + text) << vocab;
  }
}

TEST(TokenizeCli, ClearErrors) {
  // A model without tokenizer keys.
  GgufWriter w;
  w.AddKv("general.architecture", GgufValue::String("olmoe"));
  const fs::path no_vocab = kBin / ("tokenizer_cli_test_no_vocab_" + std::to_string(getpid()) + ".gguf");
  ASSERT_TRUE(w.Begin(no_vocab.string()).ok());
  ASSERT_TRUE(w.Finish().ok());
  CliRun r = Estream("tokenize -m " + Q(no_vocab) + " -p hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("no tokenizer"), std::string::npos) << r.err;
  fs::remove(no_vocab);
  // Not a GGUF file at all.
  r = Estream("tokenize -m " + Q(kTok / "README.md") + " -p hi");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("README.md"), std::string::npos) << r.err;
  // No text.
  r = Estream("tokenize -m " + Q(kTok / "ggml-vocab-gpt-2.gguf"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("-p TEXT or -f FILE"), std::string::npos) << r.err;
}

// The text scored in the perplexity tests: 160 words of plain English.
fs::path PerplexityText() {
  const fs::path p = kBin / ("tokenizer_cli_test_ppl_" + std::to_string(getpid()) + ".txt");
  std::string text;
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then",
                         "runs", "back", "home", "again", "while", "birds", "sing"};
  for (int i = 0; i < 160; ++i) text += std::string(words[(i * 7 + i / 5) % 17]) + (i % 11 == 10 ? ".\n" : " ");
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

TEST(PerplexityCli, WindowsAddUpAndMatchPrefill) {
  const fs::path model = kModels / "qwen3moe-tiny-f32.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no tiny model at " << model;
  const fs::path text = PerplexityText();
  CliRun r = Estream("perplexity -m " + Q(model) + " -f " + Q(text) + " --ctx 48 -t 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t n_text = j["n_text_tokens"];
  const auto& windows = j["windows"];
  ASSERT_EQ(j["bos"], false);  // this vocabulary adds no BOS
  ASSERT_EQ(static_cast<int64_t>(windows.size()), (n_text + 47) / 48 - (n_text % 48 == 1 ? 1 : 0));
  double ll = 0;
  int64_t scored = 0, tokens = 0;
  for (const auto& w : windows) {
    EXPECT_LE(w["n_tokens"].get<int64_t>(), 48);
    EXPECT_EQ(w["n_scored"].get<int64_t>(), w["n_tokens"].get<int64_t>() - 1);
    ll += w["log_likelihood"].get<double>();
    scored += w["n_scored"].get<int64_t>();
    tokens += w["n_tokens"].get<int64_t>();
  }
  EXPECT_EQ(tokens, n_text);
  EXPECT_EQ(scored, j["n_scored"].get<int64_t>());
  EXPECT_NEAR(ll, j["log_likelihood"].get<double>(), 1e-9 * std::abs(ll));
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(-ll / static_cast<double>(scored)),
              1e-9 * j["perplexity"].get<double>());
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 0u);
  // --json keeps stdout silent until the end: progress on stderr (plain lines off a terminal).
  EXPECT_NE(r.err.find(" windows (100%), "), std::string::npos) << r.err;

  // One window holding the whole text scores exactly what `prefill --logprobs` scores for it
  // (same tokens, same engine; the sums may differ only in summation order: float logprobs
  // summed in double, so a relative 1e-6 covers it).
  CliRun one = Estream("perplexity -m " + Q(model) + " -f " + Q(text) + " --ctx " + std::to_string(n_text) +
                    " -t 1 --json --no-progress");
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(one.err, "");
  const auto j1 = nlohmann::json::parse(one.out);
  ASSERT_EQ(j1["n_windows"], 1);
  CliRun pre = Estream("prefill -m " + Q(model) + " -f " + Q(text) + " --no-bos --logprobs -t 1 --json");
  ASSERT_EQ(pre.rc, 0) << pre.err;
  fs::remove(text);
  const auto jp = nlohmann::json::parse(pre.out);
  EXPECT_EQ(jp["n_tokens"].get<int64_t>(), n_text);
  EXPECT_NEAR(j1["log_likelihood"].get<double>(), jp["log_likelihood"].get<double>(),
              1e-6 * std::abs(jp["log_likelihood"].get<double>()));
}

// --llama-cpp: llama-perplexity's rule (its figures agree to 1e-7 on the tiny models: PERFORMANCE.md,
// "estream eval against llama-perplexity"): the file less one final newline, whole windows only,
// each window's tokens ctx/2 + 1 .. ctx - 1 scored; each window's sum equals prefill's.
TEST(PerplexityCli, LlamaCppRuleScoresTheSecondHalfOfWholeWindows) {
  const fs::path model = kModels / "qwen3moe-tiny-f32.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no tiny model at " << model;
  const fs::path text = PerplexityText();
  const std::string body = Slurp(text);
  std::ofstream(text, std::ios::binary | std::ios::app) << "\n";  // dropped, as llama-perplexity drops it
  const int ctx = 32;
  CliRun r = Estream("perplexity -m " + Q(model) + " -f " + Q(text) + " --ctx 32 --llama-cpp -t 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["llama_cpp"], true);
  const fs::path stripped = kBin / ("tokenizer_cli_test_ppl_body_" + std::to_string(getpid()) + ".txt");
  std::ofstream(stripped, std::ios::binary) << body;
  CliRun t = Estream("tokenize -m " + Q(model) + " -f " + Q(stripped) + " --json");
  fs::remove(stripped);
  fs::remove(text);
  ASSERT_EQ(t.rc, 0) << t.err;
  const std::vector<int32_t> ids = nlohmann::json::parse(t.out)["ids"];
  ASSERT_EQ(j["n_text_tokens"].get<size_t>(), ids.size());
  const auto& windows = j["windows"];
  ASSERT_EQ(windows.size(), ids.size() / ctx);
  ASSERT_GE(windows.size(), 2u);
  for (size_t w = 0; w < 2; ++w) {
    EXPECT_EQ(windows[w]["n_tokens"], ctx);
    EXPECT_EQ(windows[w]["n_scored"], ctx - 1 - ctx / 2);
    std::string list;
    for (int i = 0; i < ctx; ++i) list += (i ? "," : "") + std::to_string(ids[w * ctx + i]);
    CliRun p = Estream("prefill -m " + Q(model) + " --tokens " + list + " --logprobs -t 1 --json");
    ASSERT_EQ(p.rc, 0) << p.err;
    const auto lp = nlohmann::json::parse(p.out)["logprobs"];  // lp[i]: token i + 1's
    double want = 0;
    for (int i = ctx / 2; i < ctx - 1; ++i) want += lp[i].get<double>();
    EXPECT_NEAR(windows[w]["log_likelihood"].get<double>(), want, 1e-6 * std::abs(want)) << w;
  }
  // Fewer than 2 x --ctx tokens: refused, as llama-perplexity refuses it (it gave a figure from
  // one window); exactly 2 x --ctx: two windows.
  const std::string half = std::to_string(ids.size() / 2);
  const fs::path again = PerplexityText();
  CliRun two = Estream("perplexity -m " + Q(model) + " -f " + Q(again) + " --ctx " + half + " --llama-cpp -t 1 --json");
  ASSERT_EQ(two.rc, 0) << two.err;
  EXPECT_EQ(nlohmann::json::parse(two.out)["n_windows"], 2);
  const std::string more = std::to_string(ids.size() / 2 + 1);
  CliRun short_text = Estream("perplexity -m " + Q(model) + " -f " + Q(again) + " --ctx " + more + " --llama-cpp -t 1");
  EXPECT_EQ(short_text.rc, 1);
  EXPECT_NE(short_text.err.find("tokens long; --llama-cpp needs at least 2 x --ctx = "), std::string::npos)
      << short_text.err;
  // A window too short to have a second half to score.
  CliRun bad = Estream("perplexity -m " + Q(model) + " -f " + Q(again) + " --ctx 2 --llama-cpp -t 1");
  fs::remove(again);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--ctx 3 or more"), std::string::npos) << bad.err;
}

// A text file whose name is not valid UTF-8: --json writes U+FFFD for the bad byte instead of
// aborting after the run.
TEST(PerplexityCli, JsonWithAPathThatIsNotUtf8) {
  const fs::path model = kModels / "qwen3moe-tiny-f32.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no tiny model at " << model;
  const fs::path text = PerplexityText();
  const fs::path latin1 = kBin / ("tokenizer_cli_test_ppl_\xff_" + std::to_string(getpid()) + ".txt");
  fs::rename(text, latin1);
  CliRun r = Estream("perplexity -m " + Q(model) + " -f " + Q(latin1) + " --ctx 48 --max-windows 1 -t 1 --json");
  fs::remove(latin1);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["file"].get<std::string>().find("tokenizer_cli_test_ppl_\xEF\xBF\xBD_"), std::string::npos) << j["file"];
  EXPECT_EQ(j["n_windows"], 1);
}

// --llama-cpp --no-bos on a vocabulary that asks for BOS (mixtral-tiny with add_bos_token set
// true): no BOS anywhere, as llama-perplexity with add_bos_token overridden to false. Before, the
// text still started with the tokenizer's BOS, so window 0 scored the same with and without the
// flag and the token count included it.
TEST(PerplexityCli, LlamaCppNoBosMeansNoBosAnywhere) {
  const fs::path source = kModels / "mixtral-tiny-f32.gguf";
  if (!fs::exists(source)) GTEST_SKIP() << "no tiny model at " << source;
  const fs::path model = kBin / ("tokenizer_cli_test_add_bos_" + std::to_string(getpid()) + ".gguf");
  fs::copy_file(source, model, fs::copy_options::overwrite_existing);
  fs::permissions(model, fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(io::UpdateMetadata(model.string(), {{"tokenizer.ggml.add_bos_token", GgufValue::Bool(true)}}, {}).ok());
  const fs::path text = PerplexityText();
  const std::string args = "perplexity -m " + Q(model) + " -f " + Q(text) + " --ctx 32 --llama-cpp -t 1 --json";
  CliRun with = Estream(args), without = Estream(args + " --no-bos");
  CliRun ids_with = Estream("tokenize -m " + Q(model) + " -f " + Q(text) + " --json");
  CliRun ids_without = Estream("tokenize -m " + Q(model) + " -f " + Q(text) + " --json --no-bos");
  fs::remove(model);
  fs::remove(text);
  ASSERT_EQ(with.rc, 0) << with.err;
  ASSERT_EQ(without.rc, 0) << without.err;
  const auto jw = nlohmann::json::parse(with.out), jn = nlohmann::json::parse(without.out);
  EXPECT_EQ(jw["bos"], true);
  EXPECT_EQ(jn["bos"], false);
  // The whole text (it ends with a space: no final newline to drop), BOS first or not at all.
  const size_t n_with = nlohmann::json::parse(ids_with.out)["ids"].size();
  const size_t n_without = nlohmann::json::parse(ids_without.out)["ids"].size();
  ASSERT_EQ(n_with, n_without + 1);
  EXPECT_EQ(jw["n_text_tokens"].get<size_t>(), n_with);
  EXPECT_EQ(jn["n_text_tokens"].get<size_t>(), n_without);
  EXPECT_NE(jw["windows"][0]["log_likelihood"].get<double>(), jn["windows"][0]["log_likelihood"].get<double>());
}

TEST(PerplexityCli, ClearErrors) {
  const fs::path model = kModels / "qwen3moe-tiny-f32.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no tiny model at " << model;
  const fs::path tiny = kBin / ("tokenizer_cli_test_one_word_" + std::to_string(getpid()) + ".txt");
  std::ofstream(tiny, std::ios::binary) << "a";
  CliRun r = Estream("perplexity -m " + Q(model) + " -f " + Q(tiny));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("at least"), std::string::npos) << r.err;
  fs::remove(tiny);
  const fs::path text = PerplexityText();
  r = Estream("perplexity -m " + Q(model) + " -f " + Q(text) + " --ctx 100000");
  fs::remove(text);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("context length"), std::string::npos) << r.err;
  r = Estream("perplexity -m " + Q(model) + " -f /nonexistent/file.txt");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("/nonexistent/file.txt"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace estream

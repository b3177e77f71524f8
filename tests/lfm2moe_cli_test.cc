// The estream commands on an lfm2moe model end to end (the CLI in a fresh process): inspect,
// tokenize, pack, prefill resident and within a budget, profile, sweep and perplexity on the
// shared lfm2moe-tiny model (conv, conv, attention, conv; two dense blocks; sigmoid routing with
// an expert bias; tied head). Same steps as deepseek2_cli_test.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model_test_util.h"

namespace estream {
namespace {

using model_test::ScratchDir;

const std::string kModel = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/lfm2moe-tiny-f32.gguf";
const std::string kTokens = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/lfm2moe-tiny.tokens.txt";

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

CliResult RunCli(const ScratchDir& dir, const std::string& args) {
  const std::string err_path = dir.File("stderr.txt");
  const std::string cmd = std::string(ESTREAM_BINARY_DIR) + "/tools/estream/estream " + args + " 2>" + err_path;
  CliResult r;
  if (std::FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t k;
    while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, k);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  return r;
}

nlohmann::json Json(const CliResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

// The arg-max of the golden logits' last row: the top-1 every run must report.
int GoldenTop1() {
  std::ifstream in(std::string(ESTREAM_SHARED_DIR) + "/testdata/models/lfm2moe-tiny-f32.logits.f32",
                   std::ios::binary);
  std::vector<float> v(48 * 512);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  int best = 0;
  for (int i = 1; i < 512; ++i)
    if (v[47 * 512 + i] > v[47 * 512 + best]) best = i;
  return best;
}

TEST(Lfm2MoeCli, EveryCommand) {
  ScratchDir dir;
  // inspect: the architecture, the conv kernel length and the routed experts of blocks 2 and 3 only.
  nlohmann::json j = Json(RunCli(dir, "inspect " + kModel + " --json"));
  EXPECT_EQ(j["architecture"], "lfm2moe");
  EXPECT_EQ(j["hyperparameters"]["shortconv.l_cache"], 3);
  EXPECT_EQ(j["experts"]["moe_layers"], 2);
  // tokenize (gpt-2 pre-tokenizer of the tiny vocabulary).
  CliResult tok = RunCli(dir, "tokenize -m " + kModel + " -p 'the cat' --ids --no-bos");
  EXPECT_EQ(tok.exit_code, 0) << tok.err;
  EXPECT_FALSE(tok.out.empty());
  // pack: dense blocks 0 and 1 keep their FFNs; blocks 2 and 3 get regions.
  const std::string packed = dir.File("lfm.packed.gguf");
  CliResult pack = RunCli(dir, "pack " + kModel + " -o " + packed);
  ASSERT_EQ(pack.exit_code, 0) << pack.err;
  // prefill, resident and within a budget: the golden top-1.
  const std::string base = "prefill --tokens @" + kTokens + " --top-k 1 -t 2 --json -m ";
  for (const std::string& extra : {std::string(""), std::string(" --budget 160M --budget-tokens 64")}) {
    SCOPED_TRACE(extra);
    j = Json(RunCli(dir, base + packed + extra));
    ASSERT_TRUE(j.contains("top")) << j.dump();
    EXPECT_EQ(j["top"][0]["token"], GoldenTop1()) << j.dump();
  }
  // profile and sweep at one budget; prefill then uses the stored choice.
  CliResult prof = RunCli(dir, "profile " + packed + " --budget 160M --groups 1,2 --calib-tokens 32 -t 2");
  EXPECT_EQ(prof.exit_code, 0) << prof.err;
  CliResult sweep =
      RunCli(dir, "sweep " + packed + " --budget 160M --groups 2 --banks 2 --queue-depths 4 --calib-tokens 32 -t 2 --json");
  EXPECT_EQ(sweep.exit_code, 0) << sweep.err;
  j = Json(RunCli(dir, base + packed + " --budget 160M --budget-tokens 64"));
  EXPECT_EQ(j["top"][0]["token"], GoldenTop1());
  // perplexity over a short text, streamed.
  std::ofstream(dir.File("text.txt")) << "The quick brown fox jumps over the lazy dog. Then it runs away, far away.\n";
  j = Json(RunCli(dir, "perplexity -m " + packed + " -f " + dir.File("text.txt") + " --ctx 16 -t 2 --json"));
  ASSERT_TRUE(j.contains("perplexity")) << j.dump();
  EXPECT_TRUE(std::isfinite(j["perplexity"].get<double>()));
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
}

}  // namespace
}  // namespace estream

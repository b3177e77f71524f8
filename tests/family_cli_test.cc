// The estream commands end to end (the CLI in a fresh process) on the shared tiny models of the
// families with leading dense blocks: inspect, tokenize, pack, prefill resident and within a
// budget, profile, sweep and perplexity. deepseek2-tiny: a dense first block, shared experts, MLA,
// YaRN; lfm2moe-tiny: conv, conv, attention, conv; two dense blocks; sigmoid routing with an
// expert bias; tied head.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "model_test_util.h"

namespace estream {
namespace {

using model_test::ScratchDir;

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";

// One family's tiny model and what `inspect` must show of it.
struct Family {
  const char* arch;         // general.architecture and the file prefix (ARCH-tiny-f32.gguf)
  const char* key;          // a hyper-parameter of the family
  int value;                // its value in the tiny model
  int moe_layers;           // blocks with routed experts (the rest are dense)
};
const Family kFamilies[] = {
    {"deepseek2", "attention.kv_lora_rank", 128, 2},
    {"lfm2moe", "shortconv.l_cache", 3, 2},
};

using cli_test::CliResult;

CliResult RunCli(const ScratchDir& dir, const std::string& args) { return cli_test::RunCli(args, dir.File("stderr.txt")); }

nlohmann::json Json(const CliResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

// The arg-max of the golden logits' last row: the top-1 every run must report.
int GoldenTop1(const std::string& arch) {
  std::ifstream in(kModels + arch + "-tiny-f32.logits.f32",
                   std::ios::binary);
  std::vector<float> v(48 * 512);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  int best = 0;
  for (int i = 1; i < 512; ++i)
    if (v[47 * 512 + i] > v[47 * 512 + best]) best = i;
  return best;
}

void EveryCommand(const Family& f) {
  ScratchDir dir;
  const std::string model_path = kModels + f.arch + "-tiny-f32.gguf";
  const std::string tokens_path = kModels + f.arch + "-tiny.tokens.txt";
  const int top1 = GoldenTop1(f.arch);
  // inspect: the architecture, a family hyper-parameter and the MoE blocks (the dense ones have
  // no routed experts).
  nlohmann::json j = Json(RunCli(dir, "inspect " + model_path + " --json"));
  EXPECT_EQ(j["architecture"], f.arch);
  EXPECT_EQ(j["hyperparameters"][f.key], f.value);
  EXPECT_EQ(j["experts"]["moe_layers"], f.moe_layers);
  // tokenize (gpt-2 pre-tokenizer of the tiny vocabulary).
  CliResult tok = RunCli(dir, "tokenize -m " + model_path + " -p 'the cat' --ids --no-bos");
  EXPECT_EQ(tok.exit_code, 0) << tok.err;
  EXPECT_FALSE(tok.out.empty());
  // pack: the dense blocks keep their FFNs; the MoE blocks get regions.
  const std::string packed = dir.File("m.packed.gguf");
  CliResult pack = RunCli(dir, "pack " + model_path + " -o " + packed);
  ASSERT_EQ(pack.exit_code, 0) << pack.err;
  // prefill, resident and within a budget: the golden top-1.
  const std::string base = "prefill --tokens @" + tokens_path + " --top-k 1 -t 2 --json -m ";
  for (const std::string& extra : {std::string(""), std::string(" --budget 160M --budget-tokens 64")}) {
    SCOPED_TRACE(extra);
    j = Json(RunCli(dir, base + packed + extra));
    ASSERT_TRUE(j.contains("top")) << j.dump();
    EXPECT_EQ(j["top"][0]["token"], top1) << j.dump();
  }
  // profile and sweep at one budget; prefill then uses the stored choice.
  CliResult prof = RunCli(dir, "profile " + packed + " --budget 160M --groups 1,2 --calib-tokens 32 -t 2");
  EXPECT_EQ(prof.exit_code, 0) << prof.err;
  CliResult sweep =
      RunCli(dir, "sweep " + packed + " --budget 160M --groups 2 --banks 2 --queue-depths 4 --calib-tokens 32 -t 2 --json");
  EXPECT_EQ(sweep.exit_code, 0) << sweep.err;
  j = Json(RunCli(dir, base + packed + " --budget 160M --budget-tokens 64"));
  EXPECT_EQ(j["top"][0]["token"], top1);
  // perplexity over a short text, streamed.
  std::ofstream(dir.File("text.txt")) << "The quick brown fox jumps over the lazy dog. Then it runs away, far away.\n";
  j = Json(RunCli(dir, "perplexity -m " + packed + " -f " + dir.File("text.txt") + " --ctx 16 -t 2 --json"));
  ASSERT_TRUE(j.contains("perplexity")) << j.dump();
  EXPECT_TRUE(std::isfinite(j["perplexity"].get<double>()));
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
}

TEST(FamilyCli, EveryCommand) {
  for (const Family& f : kFamilies) {
    SCOPED_TRACE(f.arch);
    EveryCommand(f);
  }
}

}  // namespace
}  // namespace estream

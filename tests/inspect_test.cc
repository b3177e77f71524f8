// `estream inspect`'s summary through the library (SummarizeGguf, gguf/summary.h): content (text
// and JSON agree on the model they describe), every shared GGUF (models and vocab-only files), the
// older per-expert tensor layout. The CLI of `estream inspect` and `estream synth`, run as a user
// runs them: bad input (one-line errors, non-zero exit, nothing left behind), same seed same bytes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "gguf/gguf.h"
#include "gguf/summary.h"
#include "model/synth.h"

namespace estream {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kShared = std::string(ESTREAM_SHARED_DIR) + "/testdata/";

struct RunResult {
  int rc = -1;
  std::string out, err;
};

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("estream_inspect_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string File(const std::string& name) const { return (dir_ / name).string(); }

  RunResult Run(const std::string& args) const {
    const cli_test::CliResult c = cli_test::RunCli(args, File("stderr.txt"));
    fs::remove(File("stderr.txt"));
    return {c.exit_code, c.out, c.err};
  }

  fs::path dir_;
};

// The summary of the GGUF at `path` as text (*text) and as parsed JSON.
Json Summarize(const std::string& path, std::string* text = nullptr) {
  auto f = GgufFile::Open(path, {.mmap = false});
  EXPECT_TRUE(f.ok()) << path << ": " << f.status().message();
  if (!f.ok()) return Json();
  const GgufSummary s = SummarizeGguf(**f);
  if (text) *text = GgufSummaryText(s);
  return Json::parse(GgufSummaryJson(s));
}

// One line on stderr, "estream <cmd>: error: ...", and a non-zero exit code.
void ExpectOneLineError(const RunResult& r, const std::string& cmd, const std::string& needle) {
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.err.rfind("estream " + cmd + ": error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST_F(InspectTest, SummaryOfTinyModelTextAndJson) {
  const std::string model = File("tiny.gguf");
  auto synth = synth::SynthModel::Create({.arch = "qwen3moe", .seed = 3});
  ASSERT_TRUE(synth.ok()) << synth.status().message();
  ASSERT_TRUE((*synth)->Write(model, {}).ok());
  // W_e of the tiny qwen3moe preset at Q4_0: gate, up and down are each 128 x 256 values, i.e.
  // 1024 blocks of 32 values at 18 bytes.
  const uint64_t kWe = 3 * (128 * 256 / 32) * 18;

  std::string text;
  const Json j = Summarize(model, &text);
  for (const std::string& needle :
       {std::string("architecture:  qwen3moe"), std::string("expert_used_count"), std::string("blk.1.ffn_down_exps.weight"),
        std::string("[128, 256, 8]"), std::string("W_e (one expert's gate+up+down) = ") + std::to_string(kWe),
        std::string("bytes per type:"), std::string("q4_0"), std::string("tokenizer.ggml.pre"), std::string("\"qwen2\"")})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing: " << needle;

  EXPECT_EQ(j["architecture"], "qwen3moe");
  EXPECT_EQ(j["hyperparameters"]["block_count"], 2);
  EXPECT_EQ(j["hyperparameters"]["expert_count"], 8);
  EXPECT_EQ(j["tokenizer"]["tokenizer.ggml.tokens"]["length"], 512);
  EXPECT_EQ(j["tensors"].size(), 3u + 2u * 12u);
  EXPECT_EQ(j["experts"]["W_e"], kWe);
  EXPECT_EQ(j["experts"]["moe_layers"], 2);
  EXPECT_EQ(j["experts"]["bytes"], 2 * 8 * kWe);
  for (const Json& l : j["experts"]["layers"]) {
    EXPECT_EQ(l["W_e"], kWe);
    EXPECT_EQ(l["n_expert"], 8);
  }
  // The totals add up, and agree with the reader.
  uint64_t sum = 0, by_type = 0;
  for (const Json& t : j["tensors"]) sum += t["bytes"].get<uint64_t>();
  for (const auto& [type, v] : j["bytes_by_type"].items()) by_type += v["bytes"].get<uint64_t>();
  EXPECT_EQ(j["totals"]["tensor_bytes"], sum);
  EXPECT_EQ(by_type, sum);
  EXPECT_EQ(j["totals"]["non_expert_bytes"].get<uint64_t>() + j["totals"]["expert_bytes"].get<uint64_t>(), sum);
  auto f = GgufFile::Open(model);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(j["totals"]["file_bytes"], (*f)->file_size());
  ASSERT_EQ(j["tensors"].size(), (*f)->tensors().size());
  for (size_t i = 0; i < (*f)->tensors().size(); ++i) {
    EXPECT_EQ(j["tensors"][i]["name"], (*f)->tensors()[i].name);
    EXPECT_EQ(j["tensors"][i]["bytes"], (*f)->tensors()[i].n_bytes);
  }
}

TEST_F(InspectTest, SummaryOfEverySharedFile) {
  for (const char* file : {"models/olmoe-tiny-f32.gguf", "models/qwen3moe-tiny-f32.gguf", "models/mixtral-tiny-f32.gguf",
                           "tokenizer/ggml-vocab-gpt-2.gguf", "tokenizer/ggml-vocab-llama-spm.gguf",
                           "tokenizer/ggml-vocab-qwen3.gguf"}) {
    std::string text;
    const Json j = Summarize(kShared + file, &text);
    const bool vocab_only = std::string(file).rfind("tokenizer/", 0) == 0;
    EXPECT_EQ(j["tensors"].empty(), vocab_only) << file;
    EXPECT_EQ(j["experts"]["moe_layers"], vocab_only ? 0 : 2) << file;
    if (!vocab_only) {
      // F32 experts: W_e = 3 * n_embd * n_ff_expert * 4 bytes.
      const uint64_t n_ff = std::string(file).find("mixtral") != std::string::npos ? 512 : 128;
      EXPECT_EQ(j["experts"]["W_e"], 3 * 256 * n_ff * 4) << file;
    }
    EXPECT_NE(text.find("totals: "), std::string::npos) << file;
  }
}

// Older Mixtral files store each expert as its own tensors (blk.N.ffn_gate.E.weight).
TEST_F(InspectTest, SummaryOfPerExpertLayout) {
  GgufWriter w;
  w.AddKv("general.architecture", GgufValue::String("llama"));
  w.AddKv("llama.expert_count", GgufValue::U32(3));
  for (int e = 0; e < 3; ++e) {
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate." + std::to_string(e) + ".weight", QuantType::kQ8_0, {64, 32}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_up." + std::to_string(e) + ".weight", QuantType::kQ8_0, {64, 32}).ok());
    ASSERT_TRUE(w.AddTensor("blk.0.ffn_down." + std::to_string(e) + ".weight", QuantType::kQ8_0, {32, 64}).ok());
  }
  ASSERT_TRUE(w.AddTensor("blk.0.ffn_gate_inp.weight", QuantType::kF32, {64, 3}).ok());
  ASSERT_TRUE(w.Begin(File("per_expert.gguf")).ok());
  for (const GgufTensorInfo& t : w.tensors()) {
    std::vector<uint8_t> data(t.n_bytes, 0);
    ASSERT_TRUE(w.WriteTensorData(data.data(), data.size()).ok());
  }
  ASSERT_TRUE(w.Finish().ok());
  const Json j = Summarize(File("per_expert.gguf"));
  ASSERT_EQ(j["experts"]["layers"].size(), 1u);
  EXPECT_EQ(j["experts"]["layers"][0]["layout"], "per-expert");
  EXPECT_EQ(j["experts"]["layers"][0]["n_expert"], 3);
  EXPECT_EQ(j["experts"]["W_e"], 3 * (64 * 32 / 32) * 34);  // three 64x32 Q8_0 matrices
  EXPECT_EQ(j["totals"]["non_expert_bytes"], 64 * 3 * 4);    // the router
}

// A packed model holds its experts as records (one region tensor per layer), not as tensors:
// inspect reports them per layer (layout "packed", W_e = the record stride, bytes = n_expert
// records), with the same expert count, parameters and tensor bytes as the source model.
TEST_F(InspectTest, SummaryOfPackedModel) {
  const std::string source = kShared + "models/olmoe-tiny-f32.gguf", packed = File("tiny.packed.gguf");
  ASSERT_EQ(Run("pack -q " + source + " -o " + packed).rc, 0);
  const Json src = Summarize(source);
  std::string text;
  const Json j = Summarize(packed, &text);
  const RunResult cli = Run("inspect --json " + packed);
  ASSERT_EQ(cli.rc, 0) << cli.err;
  EXPECT_EQ(Json::parse(cli.out)["experts"], j["experts"]);
  ASSERT_EQ(j["experts"]["moe_layers"], src["experts"]["moe_layers"]);
  const uint64_t record = j["experts"]["W_e"].get<uint64_t>();
  EXPECT_EQ(record % 4096, 0u);
  EXPECT_GE(record, src["experts"]["W_e"].get<uint64_t>());  // the payload, padded
  for (const Json& l : j["experts"]["layers"]) {
    EXPECT_EQ(l["layout"], "packed");
    EXPECT_EQ(l["n_expert"], 8);
    EXPECT_EQ(l["W_e"], record);
    EXPECT_EQ(l["record_bytes"], record);
    EXPECT_EQ(l["bytes"], 8 * record);
  }
  EXPECT_EQ(j["experts"]["bytes"], 2 * 8 * record);
  EXPECT_EQ(j["totals"]["expert_bytes"], 2 * 8 * record);
  EXPECT_EQ(j["totals"]["parameters"], src["totals"]["parameters"]);
  EXPECT_EQ(j["totals"]["non_expert_bytes"], src["totals"]["non_expert_bytes"]);
  for (const std::string& needle : {std::string("W_e (one expert's record: gate+up+down, 4 KiB-aligned) = ") +
                                        std::to_string(record),
                                    std::string("packed"), std::to_string(2 * 8 * record)})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing: " << needle << "\n" << text;
}

TEST_F(InspectTest, InspectBadInput) {
  ExpectOneLineError(Run("inspect " + File("missing.gguf")), "inspect", "missing.gguf");
  // A truncated model: an error naming the file, no crash.
  const std::string model = File("t.gguf");
  ASSERT_EQ(Run("synth -q -o " + model).rc, 0);
  fs::resize_file(model, fs::file_size(model) / 2);
  ExpectOneLineError(Run("inspect " + model), "inspect", "t.gguf");
  std::ofstream(File("junk.gguf")) << "this is not a gguf file at all";
  ExpectOneLineError(Run("inspect " + File("junk.gguf")), "inspect", "junk.gguf");
}

TEST_F(InspectTest, SynthBadInput) {
  const std::string out = File("m.gguf");
  ExpectOneLineError(Run("synth -o " + out + " --preset llama-70b"), "synth",
                     "tiny, olmoe-1b-7b, qwen3-30b-a3b, mixtral-8x7b");
  ExpectOneLineError(Run("synth -o " + out + " --arch mamba"), "synth", "olmoe, qwen3moe, llama");
  ExpectOneLineError(Run("synth -o " + out + " --type iq2_xxs"), "synth", "q4_0, q8_0, f16, bf16, f32");
  ExpectOneLineError(Run("synth -o " + out + " --experts 2 --top-k 3"), "synth", "--top-k");
  ExpectOneLineError(Run("synth -q -o " + File("no/such/dir/m.gguf")), "synth", "no/such/dir");
  ExpectOneLineError(Run("synth -q --vocab-from " + File("none.gguf") + " -o " + out), "synth", "none.gguf");
  // Nothing was written by any of the failures (only the stderr capture comes and goes).
  for (const auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
}

TEST_F(InspectTest, SynthSameSeedSameBytes) {
  ASSERT_EQ(Run("synth -q --arch llama --type q8_0 --seed 11 -o " + File("a.gguf")).rc, 0);
  ASSERT_EQ(Run("synth -q --arch llama --type q8_0 --seed 11 --threads 1 -o " + File("b.gguf")).rc, 0);
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
  };
  const auto a = read(File("a.gguf")), b = read(File("b.gguf"));
  ASSERT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b);
}

}  // namespace
}  // namespace estream

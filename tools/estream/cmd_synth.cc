// `estream synth`: writes a synthetic MoE model (random weights, skewed routers, a built-in
// byte-level BPE tokenizer) in GGUF, with the shapes and conventions of a real model family.
#include <cstdio>

#include "estream/engine.h"
#include "model/synth.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

class SynthCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-o,--output", output_, "Output GGUF file (written to a temporary name, then renamed)")->required();
    sub->add_option("--preset", opt_.preset, "Model shape: " + synth::SupportedPresetNames())->capture_default_str();
    sub->add_option("--arch", opt_.arch, "Architecture of the tiny preset: " + synth::SupportedArchNames() +
                                             " (default olmoe)");
    sub->add_option("--layers", opt_.layers, "Number of blocks (default: the preset's)")->check(CLI::Range(1, 1 << 24));
    sub->add_option("--experts", opt_.experts, "Experts per layer (default: the preset's; top-k is lowered to fit "
                                               "unless --top-k is given)")
        ->check(CLI::Range(1, 1 << 24));
    sub->add_option("--top-k", opt_.top_k, "Experts used per token (default: the preset's)")->check(CLI::Range(1, 1 << 24));
    sub->add_option("--ctx", opt_.ctx, "context_length metadata (default: the preset's)")->check(CLI::Range(1, 1 << 24));
    sub->add_option("--vocab", opt_.vocab, "Vocabulary size of the built-in BPE (default: the preset's)")->check(CLI::Range(1, 1 << 24));
    sub->add_option("--type", type_, "Weight type or llama-quantize mix of the matrices: " +
                                         synth::SupportedSynthTypeNames() + " (norms and routers are f32)")
        ->capture_default_str();
    sub->add_option("--router-skew", opt_.router_skew,
                    "Zipf exponent S of expert popularity (~1/rank^S; 0: uniform)")->capture_default_str();
    sub->add_option("--seed", opt_.seed, "Random seed (same seed, same bytes)")->capture_default_str();
    sub->add_option("--vocab-from", opt_.vocab_from, "Copy the tokenizer.* keys from this GGUF (vocab size follows it)");
    sub->add_option("-t,--threads", threads_, "Generator threads (default: all)")->check(CLI::Range(1, kMaxThreads));
    sub->add_flag("-q,--quiet", quiet_, "No progress output");
  }

  Result<int> Run() override {
    Status parsed = synth::ApplySynthType(type_, &opt_);
    if (!parsed.ok()) return parsed;
    Result<std::unique_ptr<synth::SynthModel>> model = synth::SynthModel::Create(opt_);
    if (!model.ok()) return model.status();
    const synth::ModelShape& s = (*model)->shape();
    if (!quiet_)
      std::fprintf(stderr, "synth: %s (%s) L=%d d=%d heads=%d/%d experts=%d top-%d d_ff=%d vocab=%d %s -> %s (%s)\n",
                   s.preset.c_str(), s.arch.c_str(), s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.n_expert,
                   s.n_expert_used, s.n_ff_expert, s.n_vocab, opt_.mix.empty() ? TypeName(opt_.type) : opt_.mix.c_str(),
                   output_.c_str(),
                   FormatBytes((*model)->TensorBytes()).c_str());
    synth::SynthWriteStats stats;
    Status st = (*model)->Write(output_, {.threads = threads_, .progress = !quiet_}, &stats);
    if (!st.ok()) return st;
    if (!quiet_)
      std::fprintf(stderr, "synth: wrote %s (%s) in %.1f s, %.0f MB/s\n", output_.c_str(),
                   FormatBytes(stats.file_bytes).c_str(), stats.seconds, stats.file_bytes / 1e6 / stats.seconds);
    return 0;
  }

 private:
  synth::SynthOptions opt_;
  std::string output_;
  std::string type_ = "q4_0";
  int threads_ = 0;
  bool quiet_ = false;
};

}  // namespace
ESTREAM_REGISTER_COMMAND(SynthCommand, "synth",
                         "Write a synthetic MoE model (GGUF) with the shapes of a real one: random weights, skewed routers");
}  // namespace estream::cli

#include "model/synth.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <numeric>

#include "base/fp16.h"
#include "base/timer.h"
#include "estream/engine.h"  // kMaxThreads
#include "model/bpe_builder.h"
#include "quant/quant.h"

namespace estream::synth {
namespace {

// ---- scale design (see synth.h) -------------------------------------------------------------
constexpr float kAlpha = 1.0f;          // common-direction weight of the embeddings
constexpr float kGamma = 1.5f;          // final stream energy = (1 + gamma) * initial
constexpr float kAttnGain = 1.6f;       // q/k gain: attention score std ~ kAttnGain^2
constexpr float kAttnAvgRms = 0.75f;    // rms of an attention-weighted average of v rows
constexpr float kSiluRms = 0.5965f;     // sqrt(E[silu(z)^2]), z ~ N(0,1) (0.35578 by quadrature)
constexpr float kNormJitter = 0.02f;
constexpr float kOutputGain = 2.0f;
constexpr float kQ4Step = 0.3f;         // Q4_0 direct codes: N(0,1) on a 0.3 grid, |code| <= 7
constexpr float kQ8Step = 3.2f / 127;   // Q8_0 direct codes: N(0,1) on a 3.2/127 grid

// ---- random numbers -------------------------------------------------------------------------
inline uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t HashName(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  uint64_t x = seed ^ h;
  return SplitMix64(x);
}

// xoshiro256**: fast, small state, good statistics.
class Rng {
 public:
  Rng(uint64_t stream, uint64_t index) {
    uint64_t x = stream ^ (index * 0xD1B54A32D192ED03ull);
    for (uint64_t& w : s_) w = SplitMix64(x);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Approximate N(0,1): sum of four 16-bit uniforms (Irwin-Hall, variance matched).
  float Normal() {
    const uint64_t r = Next();
    const int64_t sum = static_cast<int64_t>(r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
    constexpr float kMean = 2.0f * 65535.0f;
    const float kInvStd = 1.0f / (65536.0f * 0.57735027f);  // std of the sum: 65536 * sqrt(4/12)
    return (static_cast<float>(sum) - kMean) * kInvStd;
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Inverse-CDF tables: entry i of a table of n is round(Phi^-1((i + 0.5) / n) / step), clamped to
// [-max_code, max_code], so a uniform index becomes a quantised normal code. Q4_0 has 15 codes
// and uses 8-bit indices (the rarest code, |z| > 1.95, still gets 13 entries of 256); Q8_0 has
// 255 codes and needs 16-bit indices.
template <int kBits>
struct CodeTable {
  int8_t code[1 << kBits];
};

template <int kBits>
void FillCodeTable(CodeTable<kBits>* t, float step, int max_code) {
  constexpr int kSize = 1 << kBits;
  int i = 0;
  for (int q = -max_code; q <= max_code; ++q) {
    const double upper = q == max_code ? HUGE_VAL : (q + 0.5) * step;
    const double cdf = 0.5 * std::erfc(-upper / std::sqrt(2.0));
    while (i < kSize && (i + 0.5) / kSize < cdf) t->code[i++] = static_cast<int8_t>(q);
  }
  while (i < kSize) t->code[i++] = static_cast<int8_t>(max_code);
}

const CodeTable<8>& Q4Table() {
  static const CodeTable<8>* t = [] {
    auto* table = new CodeTable<8>;
    FillCodeTable(table, kQ4Step, 7);
    return table;
  }();
  return *t;
}

const CodeTable<16>& Q8Table() {
  static const CodeTable<16>* t = [] {
    auto* table = new CodeTable<16>;
    FillCodeTable(table, kQ8Step, 127);
    return table;
  }();
  return *t;
}

// Per-block scale multiplier in [0.9, 1.1] from 4 random bits: real blocks' scales vary too.
// One random word serves 16 blocks.
inline float BlockJitter(uint64_t word, int64_t block) {
  return 0.9f + 0.2f * static_cast<float>((word >> (4 * (block & 15))) & 15) / 15.0f;
}

void DirectQ4_0Row(Rng& rng, float sigma, int64_t n, BlockQ4_0* y) {
  const CodeTable<8>& table = Q4Table();
  uint64_t jitter = 0;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    if ((b & 15) == 0) jitter = rng.Next();
    y[b].d = Fp32ToFp16(sigma * kQ4Step * BlockJitter(jitter, b));
    // Four words of eight 8-bit indices: words 0-1 give values 0..15 (low nibbles), words 2-3
    // values 16..31 (high nibbles).
    const uint64_t r0 = rng.Next(), r1 = rng.Next(), r2 = rng.Next(), r3 = rng.Next();
    for (int j = 0; j < 8; ++j) {
      const int lo0 = table.code[(r0 >> (8 * j)) & 0xFF] + 8, hi0 = table.code[(r2 >> (8 * j)) & 0xFF] + 8;
      const int lo1 = table.code[(r1 >> (8 * j)) & 0xFF] + 8, hi1 = table.code[(r3 >> (8 * j)) & 0xFF] + 8;
      y[b].qs[j] = static_cast<uint8_t>(lo0 | (hi0 << 4));
      y[b].qs[j + 8] = static_cast<uint8_t>(lo1 | (hi1 << 4));
    }
  }
}

void DirectQ8_0Row(Rng& rng, float sigma, int64_t n, BlockQ8_0* y) {
  const CodeTable<16>& table = Q8Table();
  uint64_t jitter = 0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    if ((b & 15) == 0) jitter = rng.Next();
    y[b].d = Fp32ToFp16(sigma * kQ8Step * BlockJitter(jitter, b));
    for (int k = 0; k < kQK8_0; k += 4) {
      const uint64_t r = rng.Next();
      for (int j = 0; j < 4; ++j) y[b].qs[k + j] = table.code[(r >> (16 * j)) & 0xFFFF];
    }
  }
}

uint32_t FileType(QuantType t) {  // llama_ftype of a file whose matrices are all of type t
  switch (t) {
    case QuantType::kF32: return 0;
    case QuantType::kF16: return 1;
    case QuantType::kQ4_0: return 2;
    case QuantType::kQ8_0: return 7;
    case QuantType::kBF16: return 32;
    default: return 0;
  }
}

// Mean of sum(w^2) over the routing weights of one token, for logits N(0,1) + beta_e, with the
// arch's normalisation. Deterministic (fixed stream), 2048 samples: ~1% accuracy is plenty.
float MeanRouteWeightEnergy(const std::vector<float>& beta, int top_k, bool renormalize) {
  const int n_expert = static_cast<int>(beta.size());
  Rng rng(0x5EED5EEDull, 0);
  std::vector<float> p(n_expert);
  std::vector<int> idx(n_expert);
  double total = 0;
  const int kSamples = 2048;
  for (int s = 0; s < kSamples; ++s) {
    float mx = -INFINITY;
    for (int e = 0; e < n_expert; ++e) {
      p[e] = rng.Normal() + beta[e];
      mx = std::max(mx, p[e]);
    }
    double z = 0;
    for (int e = 0; e < n_expert; ++e) z += (p[e] = std::exp(p[e] - mx));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int a, int b) { return p[a] > p[b]; });
    double sum = 0, sum2 = 0;
    for (int k = 0; k < top_k; ++k) sum += p[idx[k]] / z;
    for (int k = 0; k < top_k; ++k) {
      const double w = p[idx[k]] / z / (renormalize ? sum : 1.0);
      sum2 += w * w;
    }
    total += sum2;
  }
  return static_cast<float>(total / kSamples);
}

// One lfm2moe layer after its attn_norm (arch_lfm2moe.cc): a short-convolution or an attention
// block, then a dense FFN (the first n_layer_dense_lead layers) or the MoE with its expert bias. Scales
// as for the other families (synth.h): every branch adds rms b. Conv block: in_proj N(0, 1/n_embd)
// gives B, C, x of unit variance, so C * sum_j w_j B x has variance L var(w): taps N(0, 1/L) keep
// it 1, and out_proj N(0, (b / sqrt(n_embd))^2) scales it to b. Dense FFN: gate/up N(0, 1/n_embd),
// down N(0, (b / (kSiluRms sqrt(n_ff)))^2). Expert bias: N(0, 0.05^2) (selection only).
template <typename Add>
void AddLfm2Layer(const ModelShape& s, int l, QuantType w, float b, Add& add) {
  const QuantType f32 = QuantType::kF32;
  const std::string p = "blk." + std::to_string(l) + ".";
  const float inv_sqrt_embd = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  if (s.conv_layer(l)) {
    add(p + "shortconv.in_proj.weight", w, {s.n_embd, 3 * int64_t{s.n_embd}}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "shortconv.conv.weight", f32, {s.conv_l, s.n_embd}, InitKind::kGaussian,
        1.0f / std::sqrt(static_cast<float>(s.conv_l)), l);
    add(p + "shortconv.out_proj.weight", w, {s.n_embd, s.n_embd}, InitKind::kGaussian, b * inv_sqrt_embd, l);
  } else {
    add(p + "attn_q.weight", w, {s.n_embd, s.n_embd_q()}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "attn_k.weight", w, {s.n_embd, s.n_embd_kv()}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "attn_v.weight", w, {s.n_embd, s.n_embd_kv()}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "attn_output.weight", w, {s.n_embd_q(), s.n_embd}, InitKind::kGaussian,
        b / (kAttnAvgRms * std::sqrt(static_cast<float>(s.n_embd_q()))), l);
    add(p + "attn_q_norm.weight", f32, {s.head_dim}, InitKind::kNorm, kAttnGain, l);
    add(p + "attn_k_norm.weight", f32, {s.head_dim}, InitKind::kNorm, kAttnGain, l);
  }
  add(p + "ffn_norm.weight", f32, {s.n_embd}, InitKind::kNorm, 1.0f, l);
  if (l < s.n_layer_dense_lead) {
    const float down = b / (kSiluRms * std::sqrt(static_cast<float>(s.n_ff)));
    add(p + "ffn_gate.weight", w, {s.n_embd, s.n_ff}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "ffn_up.weight", w, {s.n_embd, s.n_ff}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "ffn_down.weight", w, {s.n_ff, s.n_embd}, InitKind::kGaussian, down, l);
    return;
  }
  // Sigmoid scores renormalised over the k chosen: their squared mass is close to the softmax
  // router's with renormalisation, which sets the down scale below.
  const float down = b / (kSiluRms * std::sqrt(1.0f / static_cast<float>(s.n_expert_used)) *
                          std::sqrt(static_cast<float>(s.n_ff_expert)));
  add(p + "ffn_gate_inp.weight", f32, {s.n_embd, s.n_expert}, InitKind::kRouter, inv_sqrt_embd, l);
  add(p + "ffn_gate_exps.weight", w, {s.n_embd, s.n_ff_expert, s.n_expert}, InitKind::kGaussian, inv_sqrt_embd, l);
  add(p + "ffn_up_exps.weight", w, {s.n_embd, s.n_ff_expert, s.n_expert}, InitKind::kGaussian, inv_sqrt_embd, l);
  add(p + "ffn_down_exps.weight", w, {s.n_ff_expert, s.n_embd, s.n_expert}, InitKind::kGaussian, down, l);
  add(p + "exp_probs_b.bias", f32, {s.n_expert}, InitKind::kGaussian, 0.05f, l);
}

}  // namespace

namespace {

// ---- llama-quantize mixes -----------------------------------------------------------------
struct Mix {
  const char* name;
  QuantType base;
  uint32_t ftype;  // llama_ftype (general.file_type)
};
constexpr Mix kMixes[] = {
    {"q2_K", QuantType::kQ2_K, 10},   {"q3_K_S", QuantType::kQ3_K, 11}, {"q3_K_M", QuantType::kQ3_K, 12},
    {"q3_K_L", QuantType::kQ3_K, 13}, {"q4_K_S", QuantType::kQ4_K, 14}, {"q4_K_M", QuantType::kQ4_K, 15},
    {"q5_K_S", QuantType::kQ5_K, 16}, {"q5_K_M", QuantType::kQ5_K, 17}, {"q6_K", QuantType::kQ6_K, 18},
    {"q4_1", QuantType::kQ4_1, 3},    {"q5_0", QuantType::kQ5_0, 8},    {"q5_1", QuantType::kQ5_1, 9},
    {"iq4_nl", QuantType::kIQ4_NL, 25}, {"iq4_xs", QuantType::kIQ4_XS, 30}, {"mxfp4_moe", QuantType::kMXFP4, 38},
};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

const Mix* FindMix(const std::string& name) {
  std::string n = Lower(name);
  if (n == "q3_k") n = "q3_k_m";
  if (n == "q4_k") n = "q4_k_m";
  if (n == "q5_k") n = "q5_k_m";
  if (n == "mxfp4") n = "mxfp4_moe";
  for (const Mix& m : kMixes)
    if (Lower(m.name) == n) return &m;
  return nullptr;
}

}  // namespace

QuantType MixTensorType(const std::string& mix_name, const ModelShape& s, const std::string& name,
                        const std::vector<int64_t>& dims) {
  const Mix* mix = FindMix(mix_name);
  ESTREAM_CHECK(mix != nullptr, "MixTensorType: unknown mix");
  const std::string f = mix->name;
  auto is = [&](const char* m) { return f == m; };
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  const int64_t ncols = dims[0];
  const bool expert = dims.size() > 2 && dims[2] > 1;
  int layer = -1;
  if (name.rfind("blk.", 0) == 0) layer = std::atoi(name.c_str() + 4);
  const int n_layer = s.n_layer;
  const int n_gqa = s.n_head / std::max(1, s.n_head_kv);
  auto use_more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  QuantType t = mix->base;
  if (name == "output.weight") {
    if (is("mxfp4_moe") || ncols % GetTypeTraits(t)->block_size != 0) t = QuantType::kQ8_0;
    else if (t != QuantType::kQ8_0) t = QuantType::kQ6_K;
  } else if (is("mxfp4_moe")) {
    t = expert ? QuantType::kMXFP4 : QuantType::kQ8_0;
  } else if (name == "token_embd.weight") {
    // the mix's base type
  } else if (has("attn_v.weight")) {
    const int i = layer;
    if (is("q2_K")) t = n_gqa >= 4 ? QuantType::kQ4_K : QuantType::kQ3_K;
    else if (is("q3_K_M")) t = i < 2 ? QuantType::kQ5_K : QuantType::kQ4_K;
    else if (is("q3_K_L")) t = QuantType::kQ5_K;
    else if ((is("iq4_nl") || is("iq4_xs")) && n_gqa >= 4) t = QuantType::kQ5_K;
    else if ((is("q4_K_M") || is("q5_K_M")) && use_more_bits(i, n_layer)) t = QuantType::kQ6_K;
    else if (is("q4_K_S") && i < 4) t = QuantType::kQ5_K;
    if (s.n_expert == 8) t = QuantType::kQ8_0;
  } else if (has("attn_k.weight")) {
    if (s.n_expert == 8) t = QuantType::kQ8_0;
  } else if (has("ffn_down")) {
    const int i = layer;
    if (is("q2_K")) t = QuantType::kQ3_K;
    else if (is("q3_K_M")) t = i < n_layer / 16 ? QuantType::kQ5_K : QuantType::kQ4_K;
    else if (is("q3_K_L")) t = QuantType::kQ5_K;
    else if (is("q4_K_M")) { if (use_more_bits(i, n_layer)) t = QuantType::kQ6_K; }
    else if (i < n_layer / 8 && (is("iq4_nl") || is("iq4_xs"))) t = QuantType::kQ5_K;
    else if (is("q5_K_M") && use_more_bits(i, n_layer)) t = QuantType::kQ6_K;
    else if (is("q4_K_S") && i < n_layer / 8) t = QuantType::kQ5_K;
  } else if (has("attn_output.weight")) {
    if (s.n_expert == 8) {
      if (is("q2_K") || is("q3_K_S") || is("q3_K_M") || is("iq4_nl") || is("q4_K_S") || is("q4_K_M") ||
          is("iq4_xs"))
        t = QuantType::kQ5_K;
    } else {
      if (is("q2_K")) t = QuantType::kQ3_K;
      else if (is("q3_K_M")) t = QuantType::kQ4_K;
      else if (is("q3_K_L")) t = QuantType::kQ5_K;
    }
  }
  // Rows that the chosen type's blocks do not divide fall back as in llama-quantize.
  if (ncols % GetTypeTraits(t)->block_size != 0) {
    switch (t) {
      case QuantType::kIQ4_XS: t = QuantType::kIQ4_NL; break;
      case QuantType::kQ2_K: case QuantType::kQ3_K: t = QuantType::kQ4_0; break;
      case QuantType::kQ4_K: t = QuantType::kQ5_0; break;
      case QuantType::kQ5_K: t = QuantType::kQ5_1; break;
      case QuantType::kQ6_K: t = QuantType::kQ8_0; break;
      default: break;
    }
    if (ncols % GetTypeTraits(t)->block_size != 0) t = QuantType::kF16;
  }
  return t;
}

std::string SupportedSynthTypeNames() {
  std::string out = "q4_0, q8_0, f16, bf16, f32 (every matrix that type)";
  for (const Mix& m : kMixes) out += std::string(", ") + m.name;
  return out + " (llama-quantize mixes)";
}

Status ApplySynthType(const std::string& name, SynthOptions* o) {
  if (const Mix* m = FindMix(name)) {
    o->mix = m->name;
    return Status::Ok();
  }
  ESTREAM_ASSIGN_OR_RETURN(o->type, ParseSynthType(name));
  o->mix.clear();
  return Status::Ok();
}

Result<QuantType> ParseSynthType(const std::string& name) {
  const auto t = ParseTypeName(name);
  if (t && (*t == QuantType::kQ4_0 || *t == QuantType::kQ8_0 || *t == QuantType::kF16 ||
            *t == QuantType::kBF16 || *t == QuantType::kF32))
    return *t;
  return Status::InvalidArgument("unknown or unsupported weight type '" + name + "'; supported: " +
                                 SupportedSynthTypeNames());
}

Result<std::unique_ptr<SynthModel>> SynthModel::Create(const SynthOptions& options) {
  std::unique_ptr<SynthModel> m(new SynthModel());
  m->options_ = options;
  ESTREAM_RETURN_IF_ERROR(m->Build());
  return m;
}

const SynthTensor* SynthModel::FindTensor(std::string_view name) const {
  for (const SynthTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t SynthModel::TensorBytes() const {
  uint64_t total = 0;
  for (const SynthTensor& t : tensors_) total += t.n_bytes();
  return total;
}

Status SynthModel::Build() {
  const SynthOptions& o = options_;
  ESTREAM_ASSIGN_OR_RETURN(shape_, FindPreset(o.preset, o.arch));
  if (!o.mix.empty() && FindMix(o.mix) == nullptr)
    return Status::InvalidArgument("unknown weight mix '" + o.mix + "'; supported: " + SupportedSynthTypeNames());
  if (o.mix.empty() && o.type != QuantType::kQ4_0 && o.type != QuantType::kQ8_0 && o.type != QuantType::kF16 &&
      o.type != QuantType::kBF16 && o.type != QuantType::kF32)
    return Status::InvalidArgument(std::string("unsupported weight type '") + TypeName(o.type) +
                                   "'; supported: " + SupportedSynthTypeNames());
  if (o.layers < 0 || o.experts < 0 || o.top_k < 0 || o.ctx < 0 || o.vocab < 0)
    return Status::InvalidArgument("--layers, --experts, --top-k, --ctx and --vocab must be positive");
  if (!(o.router_skew >= 0.0f) || !std::isfinite(o.router_skew))
    return Status::InvalidArgument("--router-skew must be a finite number >= 0 (0: uniform popularity)");
  if (o.layers > 0) shape_.n_layer = o.layers;
  if (o.experts > 0) shape_.n_expert = o.experts;
  if (o.top_k > 0) shape_.n_expert_used = o.top_k;
  else shape_.n_expert_used = std::min(shape_.n_expert_used, shape_.n_expert);  // fit --experts
  if (o.ctx > 0) shape_.n_ctx = o.ctx;
  if (o.vocab > 0) shape_.n_vocab = o.vocab;

  // ---- tokenizer ----
  std::vector<GgufKv> tokenizer_kvs;
  std::string tokenizer_source = "estream-bpe";
  if (!o.vocab_from.empty()) {
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> vf, GgufFile::Open(o.vocab_from));
    for (const GgufKv& kv : vf->kvs())
      if (kv.key.rfind("tokenizer.", 0) == 0) tokenizer_kvs.push_back(kv);
    const GgufValue* tokens = vf->Find("tokenizer.ggml.tokens");
    if (tokens == nullptr || tokens->type != GgufType::kArray || tokens->elem_type != GgufType::kString ||
        tokens->array.empty())
      return Status::InvalidArgument(o.vocab_from + ": --vocab-from needs a GGUF with a tokenizer.ggml.tokens "
                                     "string array (a model or a vocab-only file)");
    shape_.n_vocab = static_cast<int>(tokens->array.size());
    tokenizer_source = o.vocab_from.substr(o.vocab_from.find_last_of('/') + 1);
  }
  ESTREAM_RETURN_IF_ERROR(shape_.Validate());
  if (o.vocab_from.empty()) {
    ESTREAM_ASSIGN_OR_RETURN(BpeVocab bpe, BuildByteBpe({.vocab_size = shape_.n_vocab}));
    tokenizer_kvs.push_back({"tokenizer.ggml.model", GgufValue::String("gpt2")});
    tokenizer_kvs.push_back({"tokenizer.ggml.pre", GgufValue::String(shape_.tokenizer_pre())});
    tokenizer_kvs.push_back({"tokenizer.ggml.tokens", GgufValue::StringArray(bpe.tokens)});
    tokenizer_kvs.push_back({"tokenizer.ggml.token_type", GgufValue::I32Array(bpe.token_types)});
    tokenizer_kvs.push_back({"tokenizer.ggml.merges", GgufValue::StringArray(bpe.merges)});
    tokenizer_kvs.push_back({"tokenizer.ggml.bos_token_id", GgufValue::U32(static_cast<uint32_t>(bpe.bos_id))});
    tokenizer_kvs.push_back({"tokenizer.ggml.eos_token_id", GgufValue::U32(static_cast<uint32_t>(bpe.eos_id))});
    tokenizer_kvs.push_back({"tokenizer.ggml.add_bos_token", GgufValue::Bool(false)});
  }

  const ModelShape& s = shape_;
  const std::string& a = s.arch;
  const uint64_t seed = o.seed;

  // ---- the common direction u, expert ranks and router constants ----
  {
    Rng rng(HashName(seed, "synthetic.u"), 0);
    u_.resize(s.n_embd);
    double norm2 = 0;
    for (float& x : u_) {
      x = rng.Normal();
      norm2 += static_cast<double>(x) * x;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(norm2));
    for (float& x : u_) x *= inv;
  }
  router_beta_.resize(s.n_expert);
  for (int r = 0; r < s.n_expert; ++r) router_beta_[r] = -o.router_skew * std::log(1.0f + r);
  expert_ranks_.assign(s.n_layer, std::vector<int>(s.n_expert));
  router_c_.resize(s.n_layer);
  const float c0 = kAlpha / std::sqrt(1.0f + kAlpha * kAlpha);
  for (int l = 0; l < s.n_layer; ++l) {
    std::vector<int>& ranks = expert_ranks_[l];
    std::iota(ranks.begin(), ranks.end(), 0);
    Rng rng(HashName(seed, "synthetic.expert_ranks"), static_cast<uint64_t>(l));
    for (int i = s.n_expert - 1; i > 0; --i) std::swap(ranks[i], ranks[rng.Next() % (i + 1)]);
    // Expected stream growth at the FFN input of layer l (after 2l + 1 branches).
    const float growth = std::sqrt(1.0f + kGamma * (2.0f * l + 1.0f) / (2.0f * s.n_layer));
    router_c_[l] = c0 / growth;
  }

  // ---- branch scales ----
  const float r0 = std::sqrt(1.0f + kAlpha * kAlpha);
  const float b = r0 * std::sqrt(kGamma / (2.0f * s.n_layer));
  const float route_energy = MeanRouteWeightEnergy(router_beta_, s.n_expert_used, s.renormalize_routes());
  const float inv_sqrt_embd = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  const float qk_std = (s.qk_norm_whole() || s.qk_norm_per_head() ? 1.0f : kAttnGain) * inv_sqrt_embd;
  const float o_std = b / (kAttnAvgRms * std::sqrt(static_cast<float>(s.n_embd_q())));
  const float down_std = b / (kSiluRms * std::sqrt(route_energy) * std::sqrt(static_cast<float>(s.n_ff_expert)));

  // ---- tensors ----
  auto add = [&](std::string name, QuantType type, std::vector<int64_t> dims, InitKind init, float scale, int layer) {
    SynthTensor t;
    t.name = std::move(name);
    t.dims = std::move(dims);
    // The matrices of the weight type follow the mix, if any (norms and routers stay f32).
    t.type = !o.mix.empty() && type == o.type && type != QuantType::kF32 ? MixTensorType(o.mix, s, t.name, t.dims)
                                                                      : type;
    type = t.type;
    t.row_len = t.dims[0];
    t.n_rows = 1;
    for (size_t i = 1; i < t.dims.size(); ++i) t.n_rows *= t.dims[i];
    t.row_bytes = RowBytes(type, t.row_len);
    t.init = init;
    t.scale = scale;
    t.layer = layer;
    t.stream = HashName(seed, t.name);
    tensors_.push_back(std::move(t));
  };
  const QuantType w = o.type;
  const QuantType f32 = QuantType::kF32;
  add("token_embd.weight", w, {s.n_embd, s.n_vocab}, InitKind::kEmbedding, 1.0f, -1);
  // deepseek2: the attention output reads n_head * v_head_dim values; the MoE branch's energy is
  // split evenly between the routed and the shared experts; dense blocks carry all of it.
  const float v_width = static_cast<float>(s.mla() ? s.n_head * s.v_head_dim : s.n_embd_q());
  const float mla_o_std = b / (kAttnAvgRms * std::sqrt(v_width));
  const float split = s.n_expert_shared > 0 ? std::sqrt(0.5f) : 1.0f;
  const int64_t ff_shexp = int64_t{s.n_ff_expert} * s.n_expert_shared;
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", f32, {s.n_embd}, InitKind::kNorm, 1.0f, l);
    if (s.lfm2()) {
      AddLfm2Layer(s, l, w, b, add);
      continue;
    }
    if (s.mla()) {
      // Multi-head latent attention (model/mla.h), llama.cpp's tensor names and shapes.
      const int64_t H = s.n_head, hd = s.head_dim, nope = s.head_dim - s.qk_rope, r = s.kv_lora_rank;
      if (s.q_lora_rank > 0) {
        add(p + "attn_q_a.weight", w, {s.n_embd, s.q_lora_rank}, InitKind::kGaussian, inv_sqrt_embd, l);
        add(p + "attn_q_a_norm.weight", f32, {s.q_lora_rank}, InitKind::kNorm, 1.0f, l);
        add(p + "attn_q_b.weight", w, {s.q_lora_rank, H * hd}, InitKind::kGaussian,
            kAttnGain / std::sqrt(static_cast<float>(s.q_lora_rank)), l);
      } else {
        add(p + "attn_q.weight", w, {s.n_embd, H * hd}, InitKind::kGaussian, kAttnGain * inv_sqrt_embd, l);
      }
      add(p + "attn_kv_a_mqa.weight", w, {s.n_embd, r + s.qk_rope}, InitKind::kGaussian, kAttnGain * inv_sqrt_embd, l);
      add(p + "attn_kv_a_norm.weight", f32, {r}, InitKind::kNorm, 1.0f, l);
      const float inv_sqrt_r = 1.0f / std::sqrt(static_cast<float>(r));
      add(p + "attn_k_b.weight", w, {nope, r, H}, InitKind::kGaussian, inv_sqrt_r, l);
      add(p + "attn_v_b.weight", w, {r, s.v_head_dim, H}, InitKind::kGaussian, inv_sqrt_r, l);
      add(p + "attn_output.weight", w, {H * s.v_head_dim, s.n_embd}, InitKind::kGaussian, mla_o_std, l);
      add(p + "ffn_norm.weight", f32, {s.n_embd}, InitKind::kNorm, 1.0f, l);
      if (l < s.n_layer_dense_lead) {
        add(p + "ffn_gate.weight", w, {s.n_embd, s.n_ff}, InitKind::kGaussian, inv_sqrt_embd, l);
        add(p + "ffn_up.weight", w, {s.n_embd, s.n_ff}, InitKind::kGaussian, inv_sqrt_embd, l);
        add(p + "ffn_down.weight", w, {s.n_ff, s.n_embd}, InitKind::kGaussian,
            b / (kSiluRms * std::sqrt(static_cast<float>(s.n_ff))), l);
        continue;
      }
      add(p + "ffn_gate_inp.weight", f32, {s.n_embd, s.n_expert}, InitKind::kRouter, inv_sqrt_embd, l);
      add(p + "ffn_gate_exps.weight", w, {s.n_embd, s.n_ff_expert, s.n_expert}, InitKind::kGaussian, inv_sqrt_embd, l);
      add(p + "ffn_up_exps.weight", w, {s.n_embd, s.n_ff_expert, s.n_expert}, InitKind::kGaussian, inv_sqrt_embd, l);
      add(p + "ffn_down_exps.weight", w, {s.n_ff_expert, s.n_embd, s.n_expert}, InitKind::kGaussian, split * down_std, l);
      if (s.n_expert_shared > 0) {
        add(p + "ffn_gate_shexp.weight", w, {s.n_embd, ff_shexp}, InitKind::kGaussian, inv_sqrt_embd, l);
        add(p + "ffn_up_shexp.weight", w, {s.n_embd, ff_shexp}, InitKind::kGaussian, inv_sqrt_embd, l);
        add(p + "ffn_down_shexp.weight", w, {ff_shexp, s.n_embd}, InitKind::kGaussian,
            split * b / (kSiluRms * std::sqrt(static_cast<float>(ff_shexp))), l);
      }
      continue;
    }
    add(p + "attn_q.weight", w, {s.n_embd, s.n_embd_q()}, InitKind::kGaussian, qk_std, l);
    add(p + "attn_k.weight", w, {s.n_embd, s.n_embd_kv()}, InitKind::kGaussian, qk_std, l);
    add(p + "attn_v.weight", w, {s.n_embd, s.n_embd_kv()}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "attn_output.weight", w, {s.n_embd_q(), s.n_embd}, InitKind::kGaussian, o_std, l);
    if (s.qk_norm_whole()) {
      add(p + "attn_q_norm.weight", f32, {s.n_embd_q()}, InitKind::kNorm, kAttnGain, l);
      add(p + "attn_k_norm.weight", f32, {s.n_embd_kv()}, InitKind::kNorm, kAttnGain, l);
    } else if (s.qk_norm_per_head()) {
      add(p + "attn_q_norm.weight", f32, {s.head_dim}, InitKind::kNorm, kAttnGain, l);
      add(p + "attn_k_norm.weight", f32, {s.head_dim}, InitKind::kNorm, kAttnGain, l);
    }
    add(p + "ffn_norm.weight", f32, {s.n_embd}, InitKind::kNorm, 1.0f, l);
    add(p + "ffn_gate_inp.weight", f32, {s.n_embd, s.n_expert}, InitKind::kRouter, inv_sqrt_embd, l);
    add(p + "ffn_gate_exps.weight", w, {s.n_embd, s.n_ff_expert, s.n_expert}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "ffn_up_exps.weight", w, {s.n_embd, s.n_ff_expert, s.n_expert}, InitKind::kGaussian, inv_sqrt_embd, l);
    add(p + "ffn_down_exps.weight", w, {s.n_ff_expert, s.n_embd, s.n_expert}, InitKind::kGaussian, down_std, l);
  }
  if (s.lfm2()) {
    // Tied LM head: the embedding rows (rms ~sqrt(2) per value) are the output matrix, so the final
    // norm carries the output gain (logits of std ~kOutputGain; the common direction u adds the
    // same amount to every logit of a position, which the softmax ignores).
    add("token_embd_norm.weight", f32, {s.n_embd}, InitKind::kNorm, kOutputGain * inv_sqrt_embd / std::sqrt(2.0f),
        -1);
  } else {
    add("output_norm.weight", f32, {s.n_embd}, InitKind::kNorm, 1.0f, -1);
    add("output.weight", w, {s.n_embd, s.n_vocab}, InitKind::kGaussian, kOutputGain * inv_sqrt_embd, -1);
  }

  // ---- metadata (the key set and order of the reference tiny models) ----
  auto u32 = [](int v) { return GgufValue::U32(static_cast<uint32_t>(v)); };
  auto& kv = kvs_;
  kv.push_back({"general.architecture", GgufValue::String(a)});
  const std::string type_name = o.mix.empty() ? std::string(TypeName(w)) : FindMix(o.mix)->name;
  kv.push_back({"general.name", GgufValue::String("synthetic-" + s.preset + "-" + a + "-L" +
                                                  std::to_string(s.n_layer) + "-" + type_name)});
  kv.push_back({"general.file_type", GgufValue::U32(o.mix.empty() ? FileType(w) : FindMix(o.mix)->ftype)});
  kv.push_back({"general.quantization_version", GgufValue::U32(2)});
  kv.push_back({a + ".vocab_size", u32(s.n_vocab)});
  kv.push_back({a + ".context_length", u32(s.n_ctx)});
  kv.push_back({a + ".embedding_length", u32(s.n_embd)});
  kv.push_back({a + ".block_count", u32(s.n_layer)});
  kv.push_back({a + ".feed_forward_length", u32(s.n_ff)});
  if (s.mla()) {
    // The key set of shared/testdata/models/deepseek2-tiny (llama.cpp's newer converter: the
    // absorbed-form key/value lengths plus the per-head *_mla ones, head_count_kv 1).
    kv.push_back({a + ".leading_dense_block_count", u32(s.n_layer_dense_lead)});
    kv.push_back({a + ".expert_feed_forward_length", u32(s.n_ff_expert)});
    kv.push_back({a + ".expert_count", u32(s.n_expert)});
    kv.push_back({a + ".expert_used_count", u32(s.n_expert_used)});
    kv.push_back({a + ".expert_shared_count", u32(s.n_expert_shared)});
    kv.push_back({a + ".expert_group_count", u32(1)});
    kv.push_back({a + ".expert_group_used_count", u32(1)});
    kv.push_back({a + ".expert_gating_func", u32(1)});
    kv.push_back({a + ".expert_weights_scale", GgufValue::F32(1.0f)});
    kv.push_back({a + ".attention.head_count", u32(s.n_head)});
    kv.push_back({a + ".attention.head_count_kv", u32(1)});
    kv.push_back({a + ".attention.q_lora_rank", u32(s.q_lora_rank)});
    kv.push_back({a + ".attention.kv_lora_rank", u32(s.kv_lora_rank)});
    kv.push_back({a + ".attention.key_length", u32(s.kv_lora_rank + s.qk_rope)});
    kv.push_back({a + ".attention.value_length", u32(s.kv_lora_rank)});
    kv.push_back({a + ".attention.key_length_mla", u32(s.head_dim)});
    kv.push_back({a + ".attention.value_length_mla", u32(s.v_head_dim)});
    kv.push_back({a + ".attention.layer_norm_rms_epsilon", GgufValue::F32(s.rms_eps)});
    kv.push_back({a + ".rope.dimension_count", u32(s.qk_rope)});
    kv.push_back({a + ".rope.freq_base", GgufValue::F32(s.rope_freq_base)});
    if (s.yarn_factor > 0) {
      kv.push_back({a + ".rope.scaling.type", GgufValue::String("yarn")});
      kv.push_back({a + ".rope.scaling.factor", GgufValue::F32(s.yarn_factor)});
      kv.push_back({a + ".rope.scaling.original_context_length", u32(s.yarn_orig_ctx)});
      kv.push_back({a + ".rope.scaling.yarn_beta_fast", GgufValue::F32(32.0f)});
      kv.push_back({a + ".rope.scaling.yarn_beta_slow", GgufValue::F32(1.0f)});
      kv.push_back({a + ".rope.scaling.yarn_log_multiplier", GgufValue::F32(s.yarn_log_mul)});
    }
  } else if (s.lfm2()) {
    kv.push_back({a + ".expert_feed_forward_length", u32(s.n_ff_expert)});
    // The key set of llama.cpp's LFM2-MoE files (and the reference tiny model): the layer pattern
    // as a per-layer head_count_kv, no key/value/rope lengths (head_dim = n_embd / n_head).
    kv.push_back({a + ".leading_dense_block_count", u32(s.n_layer_dense_lead)});
    kv.push_back({a + ".expert_count", u32(s.n_expert)});
    kv.push_back({a + ".expert_used_count", u32(s.n_expert_used)});
    kv.push_back({a + ".expert_gating_func", u32(2)});  // sigmoid
    kv.push_back({a + ".attention.head_count", u32(s.n_head)});
    std::vector<GgufValue> kv_heads;
    for (int l = 0; l < s.n_layer; ++l) kv_heads.push_back(u32(s.conv_layer(l) ? 0 : s.n_head_kv));
    kv.push_back({a + ".attention.head_count_kv", GgufValue::Array(GgufType::kU32, std::move(kv_heads))});
    kv.push_back({a + ".attention.layer_norm_rms_epsilon", GgufValue::F32(s.rms_eps)});
    kv.push_back({a + ".rope.freq_base", GgufValue::F32(s.rope_freq_base)});
    kv.push_back({a + ".shortconv.l_cache", u32(s.conv_l)});
  } else {
    if (s.has_expert_ff_key()) kv.push_back({a + ".expert_feed_forward_length", u32(s.n_ff_expert)});
    kv.push_back({a + ".attention.head_count", u32(s.n_head)});
    kv.push_back({a + ".attention.head_count_kv", u32(s.n_head_kv)});
    kv.push_back({a + ".attention.key_length", u32(s.head_dim)});
    kv.push_back({a + ".attention.value_length", u32(s.head_dim)});
    kv.push_back({a + ".attention.layer_norm_rms_epsilon", GgufValue::F32(s.rms_eps)});
    kv.push_back({a + ".rope.dimension_count", u32(s.head_dim)});
    kv.push_back({a + ".rope.freq_base", GgufValue::F32(s.rope_freq_base)});
    kv.push_back({a + ".expert_count", u32(s.n_expert)});
    kv.push_back({a + ".expert_used_count", u32(s.n_expert_used)});
  }
  kv.push_back({"synthetic.generator", GgufValue::String("estream synth")});
  kv.push_back({"synthetic.preset", GgufValue::String(s.preset)});
  kv.push_back({"synthetic.seed", GgufValue::U64(seed)});
  kv.push_back({"synthetic.router_skew", GgufValue::F32(o.router_skew)});
  kv.push_back({"synthetic.weight_type", GgufValue::String(type_name)});
  kv.push_back({"synthetic.tokenizer_source", GgufValue::String(tokenizer_source)});
  for (GgufKv& t : tokenizer_kvs) kv.push_back(std::move(t));
  return Status::Ok();
}

void SynthModel::GenerateFloatRow(const SynthTensor& t, int64_t row, float* out) const {
  Rng rng(t.stream, static_cast<uint64_t>(row));
  const int64_t n = t.row_len;
  switch (t.init) {
    case InitKind::kGaussian:
      for (int64_t i = 0; i < n; ++i) out[i] = t.scale * rng.Normal();
      return;
    case InitKind::kNorm:
      for (int64_t i = 0; i < n; ++i) out[i] = t.scale * (1.0f + kNormJitter * rng.Normal());
      return;
    case InitKind::kEmbedding: {
      const float common = kAlpha * std::sqrt(static_cast<float>(n));
      for (int64_t i = 0; i < n; ++i) out[i] = t.scale * (rng.Normal() + common * u_[i]);
      return;
    }
    case InitKind::kRouter: {
      // Noise orthogonal to u (so it adds no per-expert bias of its own), plus the rank's bias.
      // A normed state has |x_perp|^2 = n (1 - c^2): the noise is scaled up to give N(0,1) logits.
      const float c = router_c_[t.layer];
      const float noise_scale = t.scale / std::sqrt(1.0f - c * c);
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += static_cast<double>(out[i] = noise_scale * rng.Normal()) * u_[i];
      const int rank = expert_ranks_[t.layer][row];
      const float bias = router_beta_[rank] / (c * std::sqrt(static_cast<float>(n)));
      for (int64_t i = 0; i < n; ++i) out[i] += (bias - static_cast<float>(dot)) * u_[i];
      return;
    }
  }
}

void SynthModel::GenerateRows(const SynthTensor& t, int64_t row0, int64_t n_rows, void* dst) const {
  ESTREAM_CHECK(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= t.n_rows, "GenerateRows: rows out of range");
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (t.init == InitKind::kGaussian && (t.type == QuantType::kQ4_0 || t.type == QuantType::kQ8_0)) {
    for (int64_t r = 0; r < n_rows; ++r) {
      Rng rng(t.stream, static_cast<uint64_t>(row0 + r));
      void* y = out + r * t.row_bytes;
      if (t.type == QuantType::kQ4_0) DirectQ4_0Row(rng, t.scale, t.row_len, static_cast<BlockQ4_0*>(y));
      else DirectQ8_0Row(rng, t.scale, t.row_len, static_cast<BlockQ8_0*>(y));
    }
    return;
  }
  std::vector<float> row(t.row_len);
  for (int64_t r = 0; r < n_rows; ++r) {
    GenerateFloatRow(t, row0 + r, row.data());
    QuantizeRow(t.type, row.data(), out + r * t.row_bytes, t.row_len);
  }
}

Status SynthModel::Write(const std::string& path, const SynthWriteOptions& wo, SynthWriteStats* stats) const {
  const Timer timer;
  GgufWriter writer;
  for (const GgufKv& kv : kvs_) writer.AddKv(kv.key, kv.value);
  for (const SynthTensor& t : tensors_) ESTREAM_RETURN_IF_ERROR(writer.AddTensor(t.name, t.type, t.dims));
  if (wo.threads < 0 || wo.threads > kMaxThreads)
    return Status::InvalidArgument("synth: " + std::to_string(wo.threads) + " generator threads: give 1 to " +
                                   std::to_string(kMaxThreads) + " (0: all)");
  ESTREAM_RETURN_IF_ERROR(writer.Begin(path));

  const int threads = wo.threads > 0 ? wo.threads : omp_get_max_threads();
  const uint64_t total = TensorBytes();
  std::vector<uint8_t> buffers[2];
  std::future<Status> pending;  // the write of the previous chunk, overlapping this generation
  auto wait_pending = [&]() -> Status { return pending.valid() ? pending.get() : Status::Ok(); };
  uint64_t done = 0;
  double last_print = -1;
  int k = 0;
  for (const SynthTensor& t : tensors_) {
    const int64_t rows_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(wo.chunk_bytes / t.row_bytes));
    for (int64_t row0 = 0; row0 < t.n_rows; row0 += rows_per_chunk, ++k) {
      const int64_t n = std::min(rows_per_chunk, t.n_rows - row0);
      std::vector<uint8_t>& buf = buffers[k & 1];  // its previous write finished before the last launch
      buf.resize(static_cast<size_t>(n) * t.row_bytes);
      // Rows are independent streams: any split over threads gives the same bytes.
      const int64_t rows_per_task = std::max<int64_t>(1, (n + 4 * threads - 1) / (4 * threads));
      const int64_t n_tasks = (n + rows_per_task - 1) / rows_per_task;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (n_tasks > 1)
      for (int64_t task = 0; task < n_tasks; ++task) {
        const int64_t r0 = task * rows_per_task;
        const int64_t rn = std::min(rows_per_task, n - r0);
        GenerateRows(t, row0 + r0, rn, buf.data() + r0 * t.row_bytes);
      }
      ESTREAM_RETURN_IF_ERROR(wait_pending());
      pending = std::async(std::launch::async, [&writer, &buf] { return writer.WriteTensorData(buf.data(), buf.size()); });
      done += buf.size();
      const double now = timer.Seconds();
      if (wo.progress && (now - last_print >= 0.5 || done == total)) {
        last_print = now;
        std::fprintf(stderr, "\rsynth: %5.1f%%  %8.1f / %.1f MB  %6.0f MB/s", 100.0 * done / std::max<uint64_t>(1, total),
                     done / 1e6, total / 1e6, done / 1e6 / std::max(now, 1e-9));
        std::fflush(stderr);
      }
    }
  }
  ESTREAM_RETURN_IF_ERROR(wait_pending());
  ESTREAM_RETURN_IF_ERROR(writer.Finish());
  if (wo.progress) std::fprintf(stderr, "\n");
  if (stats != nullptr) {
    stats->file_bytes = writer.ExpectedFileSize();
    stats->seconds = timer.Seconds();
  }
  return Status::Ok();
}

}  // namespace estream::synth

#include "model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <initializer_list>
#include <vector>

#include "quant/quant.h"

namespace estream::model {
namespace {

std::string ShapeOf(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) {
    if (s.size() > 1) s += ", ";
    s += std::to_string(d);
  }
  return s + "]";
}

// Releases the file pages of [p, p + n) from this process's mapping (they stay in the page cache
// and would fault back in on access). Used after a tensor is repacked so the model is not held
// twice. Only whole pages strictly inside the range are released.
void ReleaseMappedRange(const void* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

// Reads one model. A class (friend of Model) so the helpers share the file, the config and the
// options without long argument lists.
class ModelLoader {
 public:
  // check_only: Model::Validate's mode, on a file that may not be mapped: every check of Load,
  // but no tensor byte is read and nothing is built (the model's views stay empty).
  ModelLoader(Model* m, const GgufFile& f, const ModelLoadOptions& options, bool check_only = false)
      : m_(m), f_(f), options_(options), check_only_(check_only) {}

  Status Load() {
    ESTREAM_RETURN_IF_ERROR(ReadConfig());
    ESTREAM_RETURN_IF_ERROR(ReadTensors());
    if (options_.prefault) Prefault();
    return Status::Ok();
  }

 private:
  std::string Key(const char* suffix) const { return std::string(m_->config_.arch->gguf_name) + "." + suffix; }

  Status Bad(const std::string& what) const { return Status::Corruption(f_.path() + ": " + what); }

  Result<int> GetInt(const char* suffix) const {
    ESTREAM_ASSIGN_OR_RETURN(uint32_t v, f_.GetU32(Key(suffix)));
    if (v > (1u << 30)) return Bad(fmt::format("metadata {} = {} is out of range", Key(suffix), v));
    return static_cast<int>(v);
  }
  Result<int> GetIntOr(const char* suffix, int fallback) const {
    if (!f_.Find(Key(suffix))) return fallback;
    return GetInt(suffix);
  }

  // attention.head_count_kv: one number, or (llama.cpp's per-layer form) an array of block_count
  // numbers. In the array every attention layer must have the same count (estream's attention
  // block has one shape); 0 marks an LFM2 short-convolution layer (ArchTraits::shortconv), and
  // only there. REQUIRES: block_count and head_count read.
  Status ReadHeadCountKv() {
    ModelConfig& c = m_->config_;
    const std::string key = Key("attention.head_count_kv");
    const GgufValue* v = f_.Find(key);
    if (!v || v->type != GgufType::kArray) {
      ESTREAM_ASSIGN_OR_RETURN(c.n_head_kv, GetIntOr("attention.head_count_kv", c.n_head));
      if (c.arch->shortconv) c.conv_layer.assign(c.n_layer, 0);
      return Status::Ok();
    }
    if (v->array.size() != static_cast<size_t>(c.n_layer))
      return Bad(fmt::format("{} has {} entries but {} = {} (one per layer expected)", key, v->array.size(),
                             Key("block_count"), c.n_layer));
    c.n_head_kv = 0;
    c.conv_layer.assign(c.n_layer, 0);
    for (int il = 0; il < c.n_layer; ++il) {
      const GgufValue& e = v->array[il];
      int64_t n = -1;
      if (e.type == GgufType::kU8 || e.type == GgufType::kU16 || e.type == GgufType::kU32 || e.type == GgufType::kU64)
        n = e.u > (1u << 30) ? -1 : static_cast<int64_t>(e.u);
      else if (e.type == GgufType::kI8 || e.type == GgufType::kI16 || e.type == GgufType::kI32 || e.type == GgufType::kI64)
        n = e.i;
      if (n < 0 || n > (1 << 30))
        return Bad(fmt::format("{}[{}] is not a non-negative integer", key, il));
      if (n == 0) {
        if (!c.arch->shortconv)
          return Status::NotSupported(fmt::format("{}: {}[{}] = 0 (a layer without attention) is not supported for "
                                                  "{}", f_.path(), key, il, c.arch->gguf_name));
        c.conv_layer[il] = 1;
        continue;
      }
      if (c.n_head_kv != 0 && n != c.n_head_kv)
        return Status::NotSupported(fmt::format("{}: {} gives layer {} {} kv heads but an earlier attention layer {}; "
                                                "estream needs one kv head count for all attention layers",
                                                f_.path(), key, il, n, c.n_head_kv));
      c.n_head_kv = static_cast<int>(n);
    }
    // No attention layer at all: the attention shape is unused; keep it valid.
    if (c.n_head_kv == 0) c.n_head_kv = c.n_head;
    return Status::Ok();
  }

  // LFM2's short-convolution hyper-parameters. REQUIRES: ReadHeadCountKv ran.
  Status ReadShortConvConfig() {
    ModelConfig& c = m_->config_;
    if (!c.arch->shortconv) return Status::Ok();
    const bool any_conv = std::find(c.conv_layer.begin(), c.conv_layer.end(), 1) != c.conv_layer.end();
    if (!f_.Find(Key("shortconv.l_cache"))) {
      if (any_conv)
        return Bad(fmt::format("metadata {} is missing (the kernel length of the short-convolution layers)",
                               Key("shortconv.l_cache")));
      return Status::Ok();
    }
    ESTREAM_ASSIGN_OR_RETURN(c.shortconv_l, GetInt("shortconv.l_cache"));
    if (c.shortconv_l < 1 || c.shortconv_l > 64)
      return Bad(fmt::format("{} = {} must be between 1 and 64", Key("shortconv.l_cache"), c.shortconv_l));
    // The block's q buffer holds the convolution output and its in-projection is n_embd wide.
    if (c.q_dim() != c.n_embd)
      return Status::NotSupported(fmt::format("{}: {} needs head_count * head_dim = embedding_length (got {} * {} "
                                              "vs {})", f_.path(), c.arch->gguf_name, c.n_head, c.head_dim, c.n_embd));
    return Status::Ok();
  }

  // One short-convolution layer's weights: in_proj [n_embd, 3 n_embd], conv [L, n_embd] (copied
  // to f32 and transposed to tap-major [L][n_embd] for kernels::ShortConv), out_proj
  // [n_embd, n_embd].
  Status ConvTensors(const std::string& p, bool repack, ShortConvWeights* w) {
    const ModelConfig& c = m_->config_;
    const int64_t d = c.n_embd, L = c.shortconv_l;
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "shortconv.in_proj.weight", d, 3 * d, repack, &w->in_proj));
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "shortconv.out_proj.weight", d, d, repack, &w->out_proj));
    const std::string name = p + "shortconv.conv.weight";
    ESTREAM_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(name, {L, d}));
    if (!CanDequantize(t->type))
      return Status::NotSupported(fmt::format("{}: tensor '{}' has type {}, which estream cannot read (supported: {})",
                                              f_.path(), name, TypeName(t->type), SupportedTypeNames()));
    if (check_only_) return Status::Ok();
    std::vector<float> cl(static_cast<size_t>(L * d));  // GGUF order: channel c's L taps at c * L
    const size_t row_bytes = RowBytes(t->type, L);
    for (int64_t ch = 0; ch < d; ++ch) DequantizeRow(t->type, f_.TensorData(*t) + ch * row_bytes, cl.data() + ch * L, L);
    m_->norms_.emplace_back(static_cast<size_t>(L * d));
    float* tap_major = m_->norms_.back().data();
    for (int64_t ch = 0; ch < d; ++ch)
      for (int64_t j = 0; j < L; ++j) tap_major[j * d + ch] = cl[ch * L + j];
    m_->weight_bytes_ += L * d * sizeof(float);
    w->kernel = tap_major;
    return Status::Ok();
  }

  Status ReadConfig() {
    ModelConfig& c = m_->config_;
    ESTREAM_ASSIGN_OR_RETURN(std::string arch, f_.GetString("general.architecture"));
    c.arch = FindArch(arch);
    if (!c.arch)
      return Status::NotSupported(fmt::format("{}: general.architecture '{}' is not supported (estream runs: {})",
                                              f_.path(), arch, SupportedArchNames()));
    if (f_.Find("general.name")) {
      auto name = f_.GetString("general.name");
      if (name.ok()) c.name = *name;
    }
    ESTREAM_ASSIGN_OR_RETURN(c.n_layer, GetInt("block_count"));
    ESTREAM_ASSIGN_OR_RETURN(c.n_embd, GetInt("embedding_length"));
    ESTREAM_ASSIGN_OR_RETURN(c.n_head, GetInt("attention.head_count"));
    ESTREAM_RETURN_IF_ERROR(ReadHeadCountKv());
    ESTREAM_ASSIGN_OR_RETURN(c.n_ctx, GetInt("context_length"));
    ESTREAM_ASSIGN_OR_RETURN(c.n_expert, GetIntOr("expert_count", 0));
    ESTREAM_ASSIGN_OR_RETURN(c.n_expert_used, GetIntOr("expert_used_count", 0));
    ESTREAM_ASSIGN_OR_RETURN(c.rms_eps, f_.GetF32(Key("attention.layer_norm_rms_epsilon")));
    ESTREAM_ASSIGN_OR_RETURN(c.rope_freq_base, f_.GetF32Or(Key("rope.freq_base"), 10000.0f));

    if (c.n_layer < 1 || c.n_embd < 1 || c.n_head < 1 || c.n_head_kv < 1 || c.n_ctx < 1)
      return Bad(fmt::format("{}.block_count/embedding_length/attention.head_count/head_count_kv/context_length "
                             "must be positive (got {}/{}/{}/{}/{})",
                             arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ctx));
    if (c.n_expert == 0)
      return Status::NotSupported(fmt::format("{}: {} has no experts (no {}); estream runs mixture-of-experts "
                                              "models only", f_.path(), arch, Key("expert_count")));
    if (c.n_expert_used < 1 || c.n_expert_used > c.n_expert)
      return Bad(fmt::format("{} = {} must be between 1 and {} = {}", Key("expert_used_count"), c.n_expert_used,
                             Key("expert_count"), c.n_expert));
    if (c.arch->attention == AttentionKind::kMla) {
      ESTREAM_RETURN_IF_ERROR(ReadMlaConfig());
    } else {
      if (c.n_head % c.n_head_kv != 0)
        return Bad(fmt::format("{} = {} is not a multiple of {} = {}", Key("attention.head_count"), c.n_head,
                               Key("attention.head_count_kv"), c.n_head_kv));
      if (f_.Find(Key("attention.key_length"))) {
        ESTREAM_ASSIGN_OR_RETURN(c.head_dim, GetInt("attention.key_length"));
      } else {
        if (c.n_embd % c.n_head != 0)
          return Bad(fmt::format("{} = {} is not a multiple of {} = {} and {} is absent", Key("embedding_length"),
                                 c.n_embd, Key("attention.head_count"), c.n_head, Key("attention.key_length")));
        c.head_dim = c.n_embd / c.n_head;
      }
      if (c.head_dim < 2 || c.head_dim % 2 != 0)
        return Bad(fmt::format("head_dim ({}) = {} must be even and >= 2", Key("attention.key_length"), c.head_dim));
      ESTREAM_ASSIGN_OR_RETURN(const int v_dim, GetIntOr("attention.value_length", c.head_dim));
      if (v_dim != c.head_dim)
        return Status::NotSupported(fmt::format("{}: {} = {} differs from {} = {}; estream needs equal key and "
                                                "value head widths", f_.path(), Key("attention.value_length"), v_dim,
                                                Key("attention.key_length"), c.head_dim));
      ESTREAM_ASSIGN_OR_RETURN(const int n_rot, GetIntOr("rope.dimension_count", c.head_dim));
      if (n_rot != c.head_dim)
        return Status::NotSupported(fmt::format("{}: {} = {} but head_dim = {}; partial RoPE is not supported",
                                                f_.path(), Key("rope.dimension_count"), n_rot, c.head_dim));
      if (const GgufValue* v = f_.Find(Key("rope.scaling.type")); v && v->type == GgufType::kString &&
                                                                   v->str != "none" && !v->str.empty())
        return Status::NotSupported(fmt::format("{}: {} = '{}' is not supported (only unscaled RoPE)", f_.path(),
                                                Key("rope.scaling.type"), v->str));
    }
    ESTREAM_RETURN_IF_ERROR(ReadShortConvConfig());
    if (!(c.rms_eps > 0) || !std::isfinite(c.rms_eps))
      return Bad(fmt::format("{} = {} must be a positive number", Key("attention.layer_norm_rms_epsilon"), c.rms_eps));
    // Below 1 the rotation angles grow with the dimension instead of shrinking (released models
    // use 10^4..10^6); a base of 1e-30 gave angles of 1e30 and NaN logits.
    if (!(c.rope_freq_base >= 1) || !std::isfinite(c.rope_freq_base))
      return Bad(fmt::format("{} = {} must be a number >= 1", Key("rope.freq_base"), c.rope_freq_base));
    if (f_.Find(Key("expert_feed_forward_length"))) {
      ESTREAM_ASSIGN_OR_RETURN(c.n_ff_expert, GetInt("expert_feed_forward_length"));
    } else {
      ESTREAM_ASSIGN_OR_RETURN(c.n_ff_expert, GetInt("feed_forward_length"));
    }
    if (c.n_ff_expert < 1) return Bad(fmt::format("expert feed-forward length {} must be positive", c.n_ff_expert));
    c.expert_weights_norm = c.arch->renormalize_routes;
    if (c.arch->moe_extensions) ESTREAM_RETURN_IF_ERROR(ReadMoeVariants());
    // Activations are quantised in blocks of 32 along every GEMM's input dimension.
    const bool mla = c.arch->attention == AttentionKind::kMla;
    for (auto [what, v] : {std::pair<const char*, int>{"embedding_length", c.n_embd},
                           {"head_count * key_length", mla ? kQK8A : c.q_dim()},
                           {"expert feed-forward length", c.n_ff_expert},
                           {"feed_forward_length (dense blocks)", c.n_layer_dense_lead > 0 ? c.n_ff : kQK8A},
                           {"shared experts' feed-forward length", c.n_expert_shared > 0 ? c.n_ff_shexp : kQK8A},
                           {"attention.q_lora_rank", c.q_lora_rank > 0 ? c.q_lora_rank : kQK8A},
                           {"attention.kv_lora_rank", mla ? c.kv_lora_rank : kQK8A},
                           {"head_count * value_length", mla ? c.n_head * c.v_head_dim : kQK8A}})
      if (v % kQK8A != 0)
        return Status::NotSupported(fmt::format("{}: {} = {} is not a multiple of {}", f_.path(), what, v, kQK8A));

    // The vocabulary size is token_embd's row count; a vocab_size key must agree.
    const GgufTensorInfo* emb = f_.FindTensor("token_embd.weight");
    if (!emb) return Bad(fmt::format("tensor 'token_embd.weight' is missing (expected shape [{}, n_vocab])", c.n_embd));
    if (emb->n_dims != 2 || emb->ne(0) != c.n_embd || emb->ne(1) < 1 || emb->ne(1) > (1 << 30))
      return Bad(fmt::format("tensor 'token_embd.weight' has shape {}, expected [{}, n_vocab]", emb->ShapeString(),
                             c.n_embd));
    c.n_vocab = static_cast<int>(emb->ne(1));
    ESTREAM_ASSIGN_OR_RETURN(const int vocab_key, GetIntOr("vocab_size", c.n_vocab));
    if (vocab_key != c.n_vocab)
      return Bad(fmt::format("{} = {} but token_embd.weight has {} rows", Key("vocab_size"), vocab_key, c.n_vocab));
    return CheckLayerIndices();
  }

  // Tensors of blocks past block_count would be ignored silently (a block_count lowered by
  // mistake or damage runs a shallower model and answers something else): refused.
  Status CheckLayerIndices() const {
    const int n_layer = m_->config_.n_layer;
    for (const GgufTensorInfo& t : f_.tensors()) {
      if (t.name.rfind("blk.", 0) != 0) continue;
      int64_t il = 0;
      size_t i = 4;
      for (; i < t.name.size() && t.name[i] >= '0' && t.name[i] <= '9'; ++i)
        il = std::min<int64_t>(il * 10 + (t.name[i] - '0'), int64_t{1} << 40);  // no overflow
      if (i == 4 || il < n_layer) continue;  // not blk.N.*, or a block of the model
      return Bad(fmt::format("the file has tensors for layer {} ('{}') but {} is {}; the metadata does not match the "
                             "tensors", il, t.name, Key("block_count"), n_layer));
    }
    return Status::Ok();
  }

  // The MoE variants of ArchTraits::moe_extensions families (llama.cpp's key names).
  Status ReadMoeVariants() {
    ModelConfig& c = m_->config_;
    ESTREAM_ASSIGN_OR_RETURN(c.n_layer_dense_lead, GetIntOr("leading_dense_block_count", 0));
    if (c.n_layer_dense_lead < 0 || c.n_layer_dense_lead >= c.n_layer)
      return Bad(fmt::format("{} = {} must be below {} = {} (at least one MoE block)", Key("leading_dense_block_count"),
                             c.n_layer_dense_lead, Key("block_count"), c.n_layer));
    if (c.n_layer_dense_lead > 0) {
      ESTREAM_ASSIGN_OR_RETURN(c.n_ff, GetInt("feed_forward_length"));
      if (c.n_ff < 1) return Bad(fmt::format("{} = {} must be positive", Key("feed_forward_length"), c.n_ff));
    }
    ESTREAM_ASSIGN_OR_RETURN(c.n_expert_shared, GetIntOr("expert_shared_count", 0));
    if (c.n_expert_shared > 0) {
      ESTREAM_ASSIGN_OR_RETURN(c.n_ff_shexp,
                               GetIntOr("expert_shared_feed_forward_length", c.n_ff_expert * c.n_expert_shared));
      if (c.n_ff_shexp < 1)
        return Bad(fmt::format("shared experts' feed-forward length {} must be positive", c.n_ff_shexp));
    }
    ESTREAM_ASSIGN_OR_RETURN(const int gating, GetIntOr("expert_gating_func", 0));
    switch (gating) {
      case 0:  // absent / none: older DeepSeek-V2 files, softmax (as llama.cpp reads them)
      case 1: c.gating = ExpertGating::kSoftmax; break;
      case 2: c.gating = ExpertGating::kSigmoid; break;
      default:
        return Status::NotSupported(fmt::format("{}: {} = {} is not supported (1 = softmax, 2 = sigmoid)", f_.path(),
                                                Key("expert_gating_func"), gating));
    }
    // Absent: the family's convention (LFM2-MoE files carry no key and always renormalise, as
    // llama.cpp's lfm2moe graph does; DeepSeek-V2's default is no renormalisation).
    ESTREAM_ASSIGN_OR_RETURN(c.expert_weights_norm,
                             f_.GetBoolOr(Key("expert_weights_norm"), c.arch->renormalize_routes));
    ESTREAM_ASSIGN_OR_RETURN(c.expert_weights_scale, f_.GetF32Or(Key("expert_weights_scale"), 1.0f));
    if (c.expert_weights_scale == 0.0f) c.expert_weights_scale = 1.0f;  // llama.cpp: 0 = not set
    if (!std::isfinite(c.expert_weights_scale) || c.expert_weights_scale < 0)
      return Bad(fmt::format("{} = {} must be a non-negative number", Key("expert_weights_scale"),
                             c.expert_weights_scale));
    if (c.n_expert > 1024)
      return Status::NotSupported(fmt::format("{}: {} = {} experts; estream's routers take at most 1024", f_.path(),
                                              Key("expert_count"), c.n_expert));
    ESTREAM_ASSIGN_OR_RETURN(const int groups, GetIntOr("expert_group_count", 1));
    ESTREAM_ASSIGN_OR_RETURN(const int groups_used, GetIntOr("expert_group_used_count", groups));
    if (groups > 1 && groups_used < groups)
      return Status::NotSupported(fmt::format("{}: group-limited routing ({} = {}, {} = {}) is not supported",
                                              f_.path(), Key("expert_group_count"), groups,
                                              Key("expert_group_used_count"), groups_used));
    return Status::Ok();
  }

  // Multi-head latent attention hyper-parameters (mla.h), as llama.cpp's deepseek2 reads them:
  // files of newer converters carry key_length = kv_lora_rank + qk_rope and value_length =
  // kv_lora_rank (the absorbed form) plus key_length_mla / value_length_mla (the per-head q/k
  // and v widths); older ones only key_length / value_length (the per-head widths).
  Status ReadMlaConfig() {
    ModelConfig& c = m_->config_;
    c.n_head_kv = c.n_head;  // decompressed: every query head has its own k and v
    ESTREAM_ASSIGN_OR_RETURN(c.q_lora_rank, GetIntOr("attention.q_lora_rank", 0));
    ESTREAM_ASSIGN_OR_RETURN(c.kv_lora_rank, GetInt("attention.kv_lora_rank"));
    ESTREAM_ASSIGN_OR_RETURN(c.qk_rope, GetInt("rope.dimension_count"));
    const bool split = f_.Find(Key("attention.key_length_mla")) != nullptr;
    ESTREAM_ASSIGN_OR_RETURN(c.head_dim, GetInt(split ? "attention.key_length_mla" : "attention.key_length"));
    ESTREAM_ASSIGN_OR_RETURN(c.v_head_dim, GetInt(split ? "attention.value_length_mla" : "attention.value_length"));
    if (c.kv_lora_rank < 1 || c.q_lora_rank < 0)
      return Bad(fmt::format("{} = {} must be positive and {} = {} non-negative", Key("attention.kv_lora_rank"),
                             c.kv_lora_rank, Key("attention.q_lora_rank"), c.q_lora_rank));
    if (c.qk_rope < 2 || c.qk_rope % 2 != 0 || c.qk_rope >= c.head_dim)
      return Bad(fmt::format("{} = {} must be even, >= 2 and below the q/k head width {} = {}",
                             Key("rope.dimension_count"), c.qk_rope,
                             Key(split ? "attention.key_length_mla" : "attention.key_length"), c.head_dim));
    c.qk_nope = c.head_dim - c.qk_rope;
    if (c.v_head_dim < 1 || c.v_head_dim > c.head_dim)
      return Status::NotSupported(fmt::format("{}: value head width {} = {} must be between 1 and the q/k head width "
                                              "{}", f_.path(), Key(split ? "attention.value_length_mla"
                                                                         : "attention.value_length"),
                                              c.v_head_dim, c.head_dim));
    if (split) {  // the absorbed-form widths, when given, must agree
      ESTREAM_ASSIGN_OR_RETURN(const int kl, GetIntOr("attention.key_length", c.kv_lora_rank + c.qk_rope));
      ESTREAM_ASSIGN_OR_RETURN(const int vl, GetIntOr("attention.value_length", c.kv_lora_rank));
      if (kl != c.kv_lora_rank + c.qk_rope || vl != c.kv_lora_rank)
        return Bad(fmt::format("{} = {} / {} = {} disagree with kv_lora_rank {} + rope.dimension_count {}",
                               Key("attention.key_length"), kl, Key("attention.value_length"), vl, c.kv_lora_rank,
                               c.qk_rope));
    }
    // RoPE scaling: none or YaRN.
    if (const GgufValue* v = f_.Find(Key("rope.scaling.type")); v && v->type == GgufType::kString && v->str == "yarn") {
      ESTREAM_ASSIGN_OR_RETURN(c.yarn_factor, f_.GetF32Or(Key("rope.scaling.factor"), 1.0f));
      ESTREAM_ASSIGN_OR_RETURN(c.yarn_orig_ctx, GetIntOr("rope.scaling.original_context_length", c.n_ctx));
      ESTREAM_ASSIGN_OR_RETURN(c.yarn_beta_fast, f_.GetF32Or(Key("rope.scaling.yarn_beta_fast"), 32.0f));
      ESTREAM_ASSIGN_OR_RETURN(c.yarn_beta_slow, f_.GetF32Or(Key("rope.scaling.yarn_beta_slow"), 1.0f));
      ESTREAM_ASSIGN_OR_RETURN(const float log_mul, f_.GetF32Or(Key("rope.scaling.yarn_log_multiplier"), 0.0f));
      c.yarn_log_mul = log_mul / 0.1f;
      if (!(c.yarn_factor >= 1.0f) || !std::isfinite(c.yarn_factor) || c.yarn_orig_ctx < 1 ||
          !std::isfinite(c.yarn_log_mul) || !std::isfinite(c.yarn_beta_fast) || !std::isfinite(c.yarn_beta_slow))
        return Bad(fmt::format("{}.rope.scaling.factor/original_context_length/yarn_* = {}/{}/{}/{}/{} are not valid "
                               "YaRN parameters (factor >= 1)", c.arch->gguf_name, c.yarn_factor, c.yarn_orig_ctx,
                               c.yarn_beta_fast, c.yarn_beta_slow, c.yarn_log_mul));
    } else if (v && v->type == GgufType::kString && v->str != "none" && !v->str.empty()) {
      return Status::NotSupported(fmt::format("{}: {} = '{}' is not supported (none or yarn)", f_.path(),
                                              Key("rope.scaling.type"), v->str));
    }
    // llama.cpp (llama-context.cpp, models/deepseek2.cpp): the rotation's magnitude is
    // 1 + 0.1 ln(factor) without a log multiplier, else 1 (DeepSeek-V2's mscale = mscale_all_dim);
    // the scores are scaled by mscale^2 / sqrt(head_dim), mscale = that magnitude times
    // 1 + 0.1 log_mul ln(factor).
    const double lf = std::log(static_cast<double>(c.yarn_factor));
    c.yarn_rope_mscale = c.yarn_factor > 1.0f && c.yarn_log_mul == 0.0f ? static_cast<float>(1.0 + 0.1 * lf) : 1.0f;
    const double mscale = c.yarn_rope_mscale * (1.0 + 0.1 * c.yarn_log_mul * lf);
    c.attn_scale = static_cast<float>(mscale * mscale / std::sqrt(static_cast<double>(c.head_dim)));
    if (!std::isfinite(c.attn_scale) || !(c.attn_scale > 0))
      return Bad(fmt::format("{}.rope.scaling.factor = {} and yarn_log_multiplier = {} give an attention scale of {}",
                             c.arch->gguf_name, c.yarn_factor, c.yarn_log_mul * 0.1f, c.attn_scale));
    return Status::Ok();
  }

  // A SwiGLU FFN blk.N.ffn_{gate,up,down}{suffix}.weight of width n (dense part of the model).
  Status Ffn(const std::string& p, const char* suffix, int64_t n, DenseFfn* f) {
    const int64_t d = m_->config_.n_embd;
    const bool rd = options_.repack_dense;
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "ffn_gate" + suffix + ".weight", d, n, rd, &f->gate));
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "ffn_up" + suffix + ".weight", d, n, rd, &f->up));
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "ffn_down" + suffix + ".weight", n, d, rd, &f->down));
    return Status::Ok();
  }

  // The attention tensors of a multi-head latent attention block (llama.cpp's names and shapes).
  Status MlaTensors(int il, LayerWeights* L) {
    ModelConfig& c = m_->config_;
    const std::string p = fmt::format("blk.{}.", il);
    const int64_t d = c.n_embd, H = c.n_head, hd = c.head_dim, r = c.kv_lora_rank;
    const bool rd = options_.repack_dense;
    MlaWeights& w = L->mla;
    if (c.q_lora_rank > 0) {
      ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_q_a.weight", d, c.q_lora_rank, rd, &w.wq_a));
      ESTREAM_ASSIGN_OR_RETURN(w.q_a_norm, Norm(p + "attn_q_a_norm.weight", c.q_lora_rank));
      ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_q_b.weight", c.q_lora_rank, H * hd, rd, &w.wq_b));
    } else {
      ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_q.weight", d, H * hd, rd, &w.wq));
    }
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_kv_a_mqa.weight", d, r + c.qk_rope, rd, &w.wkv_a));
    ESTREAM_ASSIGN_OR_RETURN(w.kv_a_norm, Norm(p + "attn_kv_a_norm.weight", r));
    if (il == 0) c.kv_b_split = f_.FindTensor(p + "attn_kv_b.weight") == nullptr;
    if (!c.kv_b_split) {
      ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_kv_b.weight", r, H * (c.qk_nope + c.v_head_dim), rd, &w.wkv_b));
    } else {
      // attn_k_b is transposed at load (TransposeKb), attn_v_b used as it is.
      ESTREAM_ASSIGN_OR_RETURN(const GgufTensorInfo* kb, Tensor(p + "attn_k_b.weight", {c.qk_nope, r, H}));
      if (!CanDequantize(kb->type))
        return Status::NotSupported(fmt::format("{}: tensor '{}' has type {}, which estream cannot read", f_.path(),
                                                kb->name, TypeName(kb->type)));
      // attn_v_b [kv_lora_rank, v_head_dim, n_head]: n_head * v_head_dim rows of kv_lora_rank.
      ESTREAM_ASSIGN_OR_RETURN(const GgufTensorInfo* vb, Tensor(p + "attn_v_b.weight", {r, c.v_head_dim, H}));
      ESTREAM_RETURN_IF_ERROR(CheckGemmType(*vb));
      Matrices(*vb, H * c.v_head_dim, r, 1, rd, &w.wv_b);
      if (!check_only_) ESTREAM_RETURN_IF_ERROR(TransposeKb(*kb, &w));
    }
    ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_output.weight", H * c.v_head_dim, d, rd, &L->wo));
    return Status::Ok();
  }

  // attn_k_b [qk_nope, kv_lora_rank, n_head] (row c of head h holds k_nope[h][i] / ckv[c] for every
  // i) transposed into w->wk_b: rows (h, i) of kv_lora_rank, as the decompression needs them.
  Status TransposeKb(const GgufTensorInfo& kb, MlaWeights* w) {
    const ModelConfig& c = m_->config_;
    const int64_t H = c.n_head, r = c.kv_lora_rank, n = H * c.qk_nope;
    std::vector<float> src(static_cast<size_t>(c.qk_nope)), t(static_cast<size_t>(n * r));
    const uint8_t* data = f_.TensorData(kb);
    const size_t row_bytes = RowBytes(kb.type, c.qk_nope);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t cc = 0; cc < r; ++cc) {
        DequantizeRow(kb.type, data + (h * r + cc) * row_bytes, src.data(), c.qk_nope);
        for (int64_t i = 0; i < c.qk_nope; ++i) t[(h * c.qk_nope + i) * r + cc] = src[i];
      }
    // Float files stay f32 (exact); quantised ones get Q8_0 (the GEMM's fast path).
    const bool quantised = kb.type != QuantType::kF32 && kb.type != QuantType::kF16 && kb.type != QuantType::kBF16;
    const QuantType type = quantised ? QuantType::kQ8_0 : QuantType::kF32;
    const size_t bytes = static_cast<size_t>(n) * RowBytes(type, r);
    AlignedPtr<uint8_t> buf = AllocAligned<uint8_t>(bytes, 4096);
    if (!buf)
      return Status::ResourceExhausted(
          fmt::format("{}: cannot allocate {} bytes for '{}' transposed", f_.path(), bytes, kb.name));
    if (quantised) {
      const size_t rb = RowBytes(type, r);
      for (int64_t row = 0; row < n; ++row) QuantizeRow(type, t.data() + row * r, buf.get() + row * rb, r);
    } else {
      std::memcpy(buf.get(), t.data(), bytes);
    }
    w->wk_b = {.type = type, .layout = kernels::WeightLayout::kGguf, .n = n, .k = r, .data = buf.get()};
    if (options_.repack_dense && kernels::CanRepack(type)) {
      AlignedPtr<uint8_t> packed = AllocAligned<uint8_t>(kernels::PackedWeightBytes(type, n, r), 4096);
      if (packed) {
        kernels::RepackWeights(type, buf.get(), n, r, packed.get());
        w->wk_b = {.type = type, .layout = kernels::WeightLayout::kPacked, .n = n, .k = r, .data = packed.get()};
        buf = std::move(packed);
      }
    }
    m_->weight_bytes_ +=
        w->wk_b.layout == kernels::WeightLayout::kPacked ? kernels::PackedWeightBytes(type, n, r) : bytes;
    m_->packed_.push_back(std::move(buf));
    return Status::Ok();
  }

  // The tensor `name` with exactly `dims` (fastest first), or a Corruption naming both shapes.
  Result<const GgufTensorInfo*> Tensor(const std::string& name, std::initializer_list<int64_t> dims) const {
    const GgufTensorInfo* t = f_.FindTensor(name);
    if (!t) return Bad(fmt::format("tensor '{}' is missing (expected shape {})", name, ShapeOf(dims)));
    bool same = t->n_dims <= static_cast<int>(dims.size());
    int d = 0;
    for (int64_t want : dims) same = same && t->ne(d++) == want;
    if (!same) return Bad(fmt::format("tensor '{}' has shape {}, expected {}", name, t->ShapeString(), ShapeOf(dims)));
    return t;
  }

  // A vector of n values converted to f32 and kept by the model.
  Result<const float*> Norm(const std::string& name, int64_t n) {
    ESTREAM_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(name, {n}));
    if (!CanDequantize(t->type))
      return Status::NotSupported(fmt::format("{}: tensor '{}' has type {}, which estream cannot read (supported: {}); {}",
                                              f_.path(), name, TypeName(t->type), SupportedTypeNames(),
                                              UnsupportedTypeAdvice(static_cast<uint32_t>(t->type))));
    if (check_only_) return nullptr;
    m_->norms_.emplace_back(n);
    DequantizeRow(t->type, f_.TensorData(*t), m_->norms_.back().data(), n);
    m_->weight_bytes_ += n * sizeof(float);
    return m_->norms_.back().data();
  }

  Status CheckGemmType(const GgufTensorInfo& t) const {
    if (!kernels::GemmSupports(t.type))
      return Status::NotSupported(fmt::format("{}: tensor '{}' has type {}, which the matrix kernels do not support "
                                              "(supported: {}); {}",
                                              f_.path(), t.name, TypeName(t.type), SupportedTypeNames(),
                                              UnsupportedTypeAdvice(static_cast<uint32_t>(t.type))));
    return Status::Ok();
  }

  // Views of `count` stacked matrices of n rows x k columns in tensor t (count = 1 for 2-D),
  // repacked into one buffer when `repack` and the kernels support it.
  void Matrices(const GgufTensorInfo& t, int64_t n, int64_t k, int count, bool repack,
                kernels::WeightView* out) {
    if (check_only_) return;
    const uint8_t* src = f_.TensorData(t);
    const size_t gguf_bytes = static_cast<size_t>(n) * RowBytes(t.type, k);
    if (repack && kernels::CanRepack(t.type)) {
      const size_t packed_bytes = kernels::PackedWeightBytes(t.type, n, k);
      AlignedPtr<uint8_t> buf = AllocAligned<uint8_t>(packed_bytes * count, 4096);
      if (buf) {
        for (int e = 0; e < count; ++e) {
          kernels::RepackWeights(t.type, src + e * gguf_bytes, n, k, buf.get() + e * packed_bytes);
          out[e] = {.type = t.type, .layout = kernels::WeightLayout::kPacked, .n = n, .k = k,
                    .data = buf.get() + e * packed_bytes};
        }
        ReleaseMappedRange(src, gguf_bytes * count);
        m_->weight_bytes_ += packed_bytes * count;
        m_->packed_.push_back(std::move(buf));
        return;
      }
      // Out of memory for the packed copy: fall back to the mapped layout (slower, still correct).
    }
    for (int e = 0; e < count; ++e)
      out[e] = {.type = t.type, .layout = kernels::WeightLayout::kGguf, .n = n, .k = k, .data = src + e * gguf_bytes};
    m_->weight_bytes_ += gguf_bytes * count;
    used_ranges_.push_back({src, gguf_bytes * count});
  }

  // A 2-D weight [k, n] in GGUF order (n rows of k).
  Status Matrix(const std::string& name, int64_t k, int64_t n, bool repack, kernels::WeightView* out) {
    ESTREAM_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(name, {k, n}));
    ESTREAM_RETURN_IF_ERROR(CheckGemmType(*t));
    Matrices(*t, n, k, 1, repack, out);
    return Status::Ok();
  }

  Status Experts(int il, ExpertWeights* ex) {
    const ModelConfig& c = m_->config_;
    const int64_t d = c.n_embd, ff = c.n_ff_expert, ne = c.n_expert;
    ex->gate.resize(ne);
    ex->up.resize(ne);
    ex->down.resize(ne);
    const std::string p = fmt::format("blk.{}.", il);
    const bool merged = f_.FindTensor(p + "ffn_gate_exps.weight") != nullptr;
    if (merged || !c.arch->per_expert_tensors || !f_.FindTensor(p + "ffn_gate.0.weight")) {
      struct Plane { const char* name; int64_t k, n; std::vector<kernels::WeightView>* views; };
      for (const Plane& pl : {Plane{"ffn_gate_exps.weight", d, ff, &ex->gate}, Plane{"ffn_up_exps.weight", d, ff, &ex->up},
                              Plane{"ffn_down_exps.weight", ff, d, &ex->down}}) {
        ESTREAM_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Tensor(p + pl.name, {pl.k, pl.n, ne}));
        ESTREAM_RETURN_IF_ERROR(CheckGemmType(*t));
        Matrices(*t, pl.n, pl.k, static_cast<int>(ne), options_.repack_experts, pl.views->data());
      }
      return Status::Ok();
    }
    // Mixtral's older per-expert naming.
    for (int64_t e = 0; e < ne; ++e) {
      ESTREAM_RETURN_IF_ERROR(Matrix(fmt::format("{}ffn_gate.{}.weight", p, e), d, ff, options_.repack_experts, &ex->gate[e]));
      ESTREAM_RETURN_IF_ERROR(Matrix(fmt::format("{}ffn_up.{}.weight", p, e), d, ff, options_.repack_experts, &ex->up[e]));
      ESTREAM_RETURN_IF_ERROR(Matrix(fmt::format("{}ffn_down.{}.weight", p, e), ff, d, options_.repack_experts, &ex->down[e]));
    }
    return Status::Ok();
  }

  Status ReadTensors() {
    const ModelConfig& c = m_->config_;
    const int64_t d = c.n_embd;
    const bool rd = options_.repack_dense;
    // Norm vectors are copied; reserve so the pointers handed out stay put.
    m_->norms_.reserve(6 * c.n_layer + 1);

    const GgufTensorInfo* emb = f_.FindTensor("token_embd.weight");  // shape checked in ReadConfig
    if (!CanDequantize(emb->type))
      return Status::NotSupported(fmt::format("{}: tensor 'token_embd.weight' has type {}, which estream cannot read "
                                              "(supported: {}); {}", f_.path(), TypeName(emb->type), SupportedTypeNames(),
                                              UnsupportedTypeAdvice(static_cast<uint32_t>(emb->type))));
    m_->token_embd_type_ = emb->type;
    m_->token_embd_ = f_.TensorData(*emb);
    m_->token_embd_row_bytes_ = RowBytes(emb->type, d);
    m_->weight_bytes_ += emb->n_bytes;
    used_ranges_.push_back({m_->token_embd_, emb->n_bytes});

    m_->experts_packed_ = f_.Find("estream.layout_version") != nullptr;
    m_->layers_.resize(c.n_layer);
    for (int il = 0; il < c.n_layer; ++il) {
      LayerWeights& L = m_->layers_[il];
      const std::string p = fmt::format("blk.{}.", il);
      ESTREAM_ASSIGN_OR_RETURN(L.attn_norm, Norm(p + "attn_norm.weight", d));
      if (c.is_conv_layer(il)) {
        ESTREAM_RETURN_IF_ERROR(ConvTensors(p, rd, &L.conv));
      } else if (c.arch->attention == AttentionKind::kMla) {
        ESTREAM_RETURN_IF_ERROR(MlaTensors(il, &L));
      } else {
        ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_q.weight", d, c.q_dim(), rd, &L.wq));
        ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_k.weight", d, c.kv_dim(), rd, &L.wk));
        ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_v.weight", d, c.kv_dim(), rd, &L.wv));
        ESTREAM_RETURN_IF_ERROR(Matrix(p + "attn_output.weight", c.q_dim(), d, rd, &L.wo));
        switch (c.arch->qk_norm) {
          case QkNorm::kNone: break;
          case QkNorm::kWhole: {
            ESTREAM_ASSIGN_OR_RETURN(L.q_norm, Norm(p + "attn_q_norm.weight", c.q_dim()));
            ESTREAM_ASSIGN_OR_RETURN(L.k_norm, Norm(p + "attn_k_norm.weight", c.kv_dim()));
            break;
          }
          case QkNorm::kPerHead: {
            ESTREAM_ASSIGN_OR_RETURN(L.q_norm, Norm(p + "attn_q_norm.weight", c.head_dim));
            ESTREAM_ASSIGN_OR_RETURN(L.k_norm, Norm(p + "attn_k_norm.weight", c.head_dim));
            break;
          }
        }
      }
      ESTREAM_ASSIGN_OR_RETURN(L.ffn_norm, Norm(p + "ffn_norm.weight", d));
      L.moe = c.is_moe_layer(il);
      if (!L.moe) {  // a leading dense block
        ESTREAM_RETURN_IF_ERROR(Ffn(p, "", c.n_ff, &L.ffn));
        continue;
      }
      ESTREAM_RETURN_IF_ERROR(Matrix(p + "ffn_gate_inp.weight", d, c.n_expert, false, &L.router));
      // LFM2-MoE always has the selection bias (a missing one is an error naming it).
      if (c.arch->moe_extensions && (c.arch->shortconv || f_.FindTensor(p + "exp_probs_b.bias"))) {
        ESTREAM_ASSIGN_OR_RETURN(L.exp_probs_b, Norm(p + "exp_probs_b.bias", c.n_expert));
        m_->config_.has_exp_probs_b = true;
      }
      if (c.n_expert_shared > 0) ESTREAM_RETURN_IF_ERROR(Ffn(p, "_shexp", c.n_ff_shexp, &L.shexp));
      // Packed model: the experts are records in per-layer regions (virtual_experts.h).
      if (!m_->experts_packed_) ESTREAM_RETURN_IF_ERROR(Experts(il, &L.experts));
    }
    ESTREAM_ASSIGN_OR_RETURN(m_->output_norm_, Norm(c.arch->output_norm_tensor, d));
    if (f_.FindTensor("output.weight")) {
      ESTREAM_RETURN_IF_ERROR(Matrix("output.weight", d, c.n_vocab, rd, &m_->output_));
    } else {
      // Tied embeddings: the LM head is token_embd itself.
      ESTREAM_RETURN_IF_ERROR(CheckGemmType(*emb));
      m_->output_ = {.type = emb->type, .layout = kernels::WeightLayout::kGguf, .n = c.n_vocab, .k = d,
                     .data = m_->token_embd_};
      m_->output_tied_ = true;
    }
    return Status::Ok();
  }

  // Reads one byte per page of every mapped weight, so the first request does not pay for page
  // faults (and for reading the file) inside its timed forward pass.
  void Prefault() {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    for (const auto& [p, n] : used_ranges_) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
      const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
      (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
    }
    volatile uint8_t sink = 0;
    for (const auto& [p, n] : used_ranges_) {
      const uint8_t* b = static_cast<const uint8_t*>(p);
      for (size_t off = 0; off < n; off += page) sink = sink + b[off];
      if (n) sink = sink + b[n - 1];
    }
    (void)sink;
  }

  Model* m_;
  const GgufFile& f_;
  ModelLoadOptions options_;
  const bool check_only_;
  std::vector<std::pair<const void*, size_t>> used_ranges_;  // mapped (not repacked) weights
};

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  ESTREAM_ASSIGN_OR_RETURN(m->file_, GgufFile::Open(path));
  ModelLoader loader(m.get(), *m->file_, options);
  ESTREAM_RETURN_IF_ERROR(loader.Load());
  return m;
}

Status Model::Validate(const GgufFile& file) {
  Model scratch;
  return ModelLoader(&scratch, file, {}, /*check_only=*/true).Load();
}

}  // namespace estream::model

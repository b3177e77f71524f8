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
  ModelLoader(Model* m, const ModelLoadOptions& options) : m_(m), f_(*m->file_), options_(options) {}

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
    ESTREAM_RETURN_IF_ERROR(ReadShortConvConfig());
    if (!(c.rms_eps > 0) || !std::isfinite(c.rms_eps))
      return Bad(fmt::format("{} = {} must be a positive number", Key("attention.layer_norm_rms_epsilon"), c.rms_eps));
    if (!(c.rope_freq_base > 0) || !std::isfinite(c.rope_freq_base))
      return Bad(fmt::format("{} = {} must be a positive number", Key("rope.freq_base"), c.rope_freq_base));
    if (f_.Find(Key("expert_feed_forward_length"))) {
      ESTREAM_ASSIGN_OR_RETURN(c.n_ff_expert, GetInt("expert_feed_forward_length"));
    } else {
      ESTREAM_ASSIGN_OR_RETURN(c.n_ff_expert, GetInt("feed_forward_length"));
    }
    if (c.n_ff_expert < 1) return Bad(fmt::format("expert feed-forward length {} must be positive", c.n_ff_expert));
    // Activations are quantised in blocks of 32 along every GEMM's input dimension.
    for (auto [what, v] : {std::pair<const char*, int>{"embedding_length", c.n_embd},
                           {"head_count * key_length", c.q_dim()},
                           {"expert feed-forward length", c.n_ff_expert}})
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
      return Status::NotSupported(fmt::format("{}: tensor '{}' has type {}, which estream cannot read (supported: {})",
                                              f_.path(), name, TypeName(t->type), SupportedTypeNames()));
    m_->norms_.emplace_back(n);
    DequantizeRow(t->type, f_.TensorData(*t), m_->norms_.back().data(), n);
    m_->weight_bytes_ += n * sizeof(float);
    return m_->norms_.back().data();
  }

  Status CheckGemmType(const GgufTensorInfo& t) const {
    if (!kernels::GemmSupports(t.type))
      return Status::NotSupported(fmt::format("{}: tensor '{}' has type {}, which the matrix kernels do not support "
                                              "(supported: f32, f16, bf16, q4_0, q8_0, q4_K, q6_K)",
                                              f_.path(), t.name, TypeName(t.type)));
    return Status::Ok();
  }

  // Views of `count` stacked matrices of n rows x k columns in tensor t (count = 1 for 2-D),
  // repacked into one buffer when `repack` and the kernels support it.
  void Matrices(const GgufTensorInfo& t, int64_t n, int64_t k, int count, bool repack,
                kernels::WeightView* out) {
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
    m_->norms_.reserve(4 * c.n_layer + 1);

    const GgufTensorInfo* emb = f_.FindTensor("token_embd.weight");  // shape checked in ReadConfig
    if (!CanDequantize(emb->type))
      return Status::NotSupported(fmt::format("{}: tensor 'token_embd.weight' has type {}, which estream cannot read "
                                              "(supported: {})", f_.path(), TypeName(emb->type), SupportedTypeNames()));
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
      ESTREAM_RETURN_IF_ERROR(Matrix(p + "ffn_gate_inp.weight", d, c.n_expert, false, &L.router));
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
  std::vector<std::pair<const void*, size_t>> used_ranges_;  // mapped (not repacked) weights
};

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  ESTREAM_ASSIGN_OR_RETURN(m->file_, GgufFile::Open(path));
  ModelLoader loader(m.get(), options);
  ESTREAM_RETURN_IF_ERROR(loader.Load());
  return m;
}

}  // namespace estream::model

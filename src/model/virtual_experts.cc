#include "model/virtual_experts.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include "base/stats.h"
#include "base/timer.h"
#include "config/configurator.h"
#include "config/profile.h"
#include "kernels/kernels.h"
#include "model/engine_hooks.h"
#include "model/experts.h"
#include "model/mla.h"
#include "moe/expert_op.h"

namespace estream::model {
namespace {

// estream pack checks its source as Load does and writes the layout from the same metadata, so a
// disagreement between the two means the packed file changed afterwards: packing the original
// again is what helps (a defect of the original itself is refused by pack, with its reason).
constexpr char kChangedAfterPacking[] =
    "the packed file's metadata was changed after packing or is damaged: pack the original GGUF again";

// The view of one part of a layer's records without data (type, layout and shape only).
kernels::WeightView ShapeView(const io::PackedLayerInfo& li, io::ExpertPart part) {
  const io::PackedPart& p = li.part(part);
  return {.type = p.type, .layout = p.layout, .n = p.n, .k = p.k, .data = nullptr};
}


}  // namespace

uint64_t ActivationBytes(const ModelConfig& c, int64_t n_tokens, int n_threads, bool float_experts) {
  const uint64_t T = static_cast<uint64_t>(n_tokens), d = c.n_embd, ff = c.n_ff_expert, k = c.n_expert_used;
  const uint64_t C = std::min<uint64_t>(kExpertChunkRows, T);
  const uint64_t q8 = sizeof(BlockQ8A);
  // Workspace::Reserve (blocks.cc), every buffer (x and xn fp32, acc fp64, ...):
  const uint64_t xq_width = std::max<uint64_t>(d, static_cast<uint64_t>(c.q_dim()));  // xn's and the attention's
  uint64_t b = T * d * 4 * 2 + T * d * 8 + T * (xq_width / 32) * q8 + T * c.q_dim() * 4 * 2 + T * c.kv_dim() * 4 * 2 +
               T * c.n_expert * 4 + T * k * 4 * 4 + C * d * 4 + C * (d / 32) * q8 + C * ff * 4 * 2 +
               C * (ff / 32) * q8 + T * c.kv_dim() * 4 * 2;  // tree_k, tree_v (shared-prefix candidates)
  // Dense FFNs wider than an expert (ffn.h) widen the chunk buffers; the MLA scratch (mla.h).
  const uint64_t ffw = std::max<uint64_t>({ff, static_cast<uint64_t>(c.n_ff), static_cast<uint64_t>(c.n_ff_shexp)});
  b += (C * (ffw - ff) * 4 * 2 + C * ((ffw - ff) / 32) * q8) + T * static_cast<uint64_t>(MlaScratchFloats(c)) * 4;
  if (c.has_conv_layers()) b += T * 3 * d * 4;  // the short convolutions' in-projection
  // Engine: final hidden states, one logits chunk (engine.cc's LogitsChunkRows: 2^23 / V rows,
  // 1 to 64, i.e. up to 32 MiB of floats), the prompt's log-probabilities and the LM head's
  // double scratch.
  const uint64_t V = c.n_vocab;
  const uint64_t logit_rows = std::clamp<uint64_t>((uint64_t{8} << 20) / V, 1, 64);
  b += T * d * 4 + logit_rows * V * 4 + T * 4 + 64 * 8;
  // Attention scratch inside the kernels, per thread: the fast paths' tiles (kernels.h) and the
  // scalar reference's rows of T scores.
  b += static_cast<uint64_t>(n_threads) * (kernels::AttentionScratchBytes(c.head_dim) + T * 4 * 4);
  // The output projections' residual-add tile (kernels.h Gemm, GemmOut::add), per thread.
  b += static_cast<uint64_t>(n_threads) * kernels::GemmAddTileBytes(d);
  // The bf16 attention's K and V, converted for a few kv heads at a time (kernels.h).
  b += kernels::AttentionKvBytes(c.head_dim, c.n_head, c.n_head_kv, n_tokens, n_threads);
  // The fused operator's plan (expert_op.h): the SwiGLU output of a pass of up to Wf routes
  // (Q8A; floats too for float experts), per thread the gathered rows of one unit and the gate,
  // up and down tiles.
  const uint64_t Wf = std::min<uint64_t>(kFusedRouteWindow, T * k), th = static_cast<uint64_t>(n_threads);
  const uint64_t rt = moe::ExpertPlan::kRowTile;
  b += Wf * (ff / 32) * q8 + th * rt * (d / 32) * q8 + th * 3 * 512 * 256 * 4;
  if (float_experts) b += Wf * ff * 4 + th * rt * d * 4;
  // The group route CSR of this file.
  b += T * k * 8 + (c.n_expert + 1) * 8;
  return b;
}

VirtualExperts::~VirtualExperts() = default;

Result<std::unique_ptr<VirtualExperts>> VirtualExperts::Open(Model* model, const VirtualExpertsOptions& options) {
  ESTREAM_CHECK(model->experts_packed(), "VirtualExperts::Open: not a packed model");
  std::unique_ptr<VirtualExperts> v(new VirtualExperts());
  v->model_ = model;
  v->options_ = options;
  ESTREAM_ASSIGN_OR_RETURN(v->layout_, io::ReadPackedLayout(model->file()));
  const ModelConfig& c = model->config();
  if (v->layout_.n_embd != c.n_embd || v->layout_.n_ff_expert != c.n_ff_expert || v->layout_.n_expert != c.n_expert)
    return Status::Corruption(fmt::format("{}: estream.n_embd/n_ff/n_expert = {}/{}/{} disagree with the model's "
                                          "{}/{}/{}; {}", model->path(), v->layout_.n_embd, v->layout_.n_ff_expert,
                                          v->layout_.n_expert, c.n_embd, c.n_ff_expert, c.n_expert,
                                          kChangedAfterPacking));
  v->ordinal_of_block_.assign(c.n_layer, -1);
  for (size_t i = 0; i < v->layout_.layers.size(); ++i) {
    const int blk = v->layout_.layers[i].layer;
    if (blk < 0 || blk >= c.n_layer)
      return Status::Corruption(fmt::format("{}: estream.layers names block {} of a {}-layer model", model->path(), blk,
                                            c.n_layer));
    v->ordinal_of_block_[blk] = static_cast<int>(i);
  }
  for (int il = 0; il < c.n_layer; ++il)
    if ((v->ordinal_of_block_[il] < 0) == model->layers()[il].moe)
      return Status::Corruption(!model->layers()[il].moe
                                    ? fmt::format("{}: block {} is a dense block ({}) but has a packed expert region; "
                                                  "{}", model->path(), il, "leading_dense_block_count",
                                                  kChangedAfterPacking)
                                    : fmt::format("{}: block {} has no packed expert region ({}); {}", model->path(),
                                                  il, io::packed_keys::RegionTensor(il), kChangedAfterPacking));
  // Every layer gets views of the right types and shapes; data is bound later (or now, resident).
  for (int il = 0; il < c.n_layer; ++il) {
    if (v->ordinal_of_block_[il] < 0) continue;  // a dense block
    const io::PackedLayerInfo& li = v->layout_.layers[v->ordinal_of_block_[il]];
    ExpertWeights& ex = model->layers_[il].experts;
    for (auto [part, vec] : {std::pair{io::ExpertPart::kGate, &ex.gate}, std::pair{io::ExpertPart::kUp, &ex.up},
                             std::pair{io::ExpertPart::kDown, &ex.down}}) {
      vec->assign(c.n_expert, ShapeView(li, part));
    }
  }
  for (const io::PackedLayerInfo& li : v->layout_.layers) v->config_.expert_bytes += li.record_bytes * li.n_expert;
  const bool budgeted = options.budget_bytes > 0 || options.group_size > 0 || options.banks > 0;
  if (!budgeted) {
    ESTREAM_RETURN_IF_ERROR(v->LoadResident());
    return v;
  }
  ESTREAM_RETURN_IF_ERROR(v->Solve());
  const int64_t cap = v->config_.budget_tokens * c.n_expert_used;
  v->group_token_ = AllocAligned<int32_t>(cap);
  v->group_w_ = AllocAligned<float>(cap);
  if (!v->group_token_ || !v->group_w_) return Status::ResourceExhausted("cannot allocate the group route buffers");
  v->group_capacity_ = cap;
  // One fused-operator plan per expert shape class (all layers share one in these models).
  v->slot_begin_.assign(c.n_expert + 1, 0);
  v->verified_.assign(v->layout_.layers.size() * c.n_expert, 0);
  v->bindings_.resize(c.n_expert);
  for (const io::PackedLayerInfo& li : v->layout_.layers) {
    const moe::ExpertShape shape = moe::ExpertShape::Of(ShapeView(li, io::ExpertPart::kGate),
                                                        ShapeView(li, io::ExpertPart::kUp),
                                                        ShapeView(li, io::ExpertPart::kDown));
    bool have = false;
    for (const moe::ExpertPlan& p : v->plans_) have = have || p.shape() == shape;
    if (have) continue;
    ESTREAM_ASSIGN_OR_RETURN(moe::ExpertPlan plan, moe::ExpertPlan::Create(shape, std::min<int64_t>(kFusedRouteWindow, cap),
                                                                           v->config_.budget_tokens, options.n_threads));
    v->plans_.push_back(std::move(plan));
  }
  pipeline::StreamParams sp;
  sp.layout = &v->layout_;
  sp.file = options.hooks ? options.hooks->expert_file : nullptr;
  sp.group_size = v->config_.group_size;
  sp.n_banks = v->config_.banks;
  sp.cache_banks = v->config_.cache_banks;
  sp.queue_depth = v->config_.queue_depth;
  sp.schedule = options.schedule;
  sp.backend = options.io;
  // Checksums are checked by the compute team when a group is first used (RunExperts), not by
  // the feeder thread: on a machine with as many compute threads as cores a third busy thread
  // stalls the OpenMP team at every barrier (docs/PERFORMANCE.md, "Expert virtualization").
  sp.verify_checksums = false;
  sp.trace = options.trace;
  sp.max_feeder_delay_s_for_testing = options.hooks ? options.hooks->max_feeder_delay_s : 0;
  ESTREAM_ASSIGN_OR_RETURN(v->streamer_, pipeline::ExpertStreamer::Create(sp));
  v->config_.streamed = true;
  v->config_.schedule = options.schedule;
  v->config_.io_backend = IoBackendName(v->streamer_->loader().backend());
  v->config_.arena_bytes = v->streamer_->arena().total_bytes();
  return v;
}

Status VirtualExperts::LoadResident() {
  std::unique_ptr<io::PosixFile> owned;
  io::File* file = options_.hooks ? options_.hooks->expert_file : nullptr;
  if (!file) {
    ESTREAM_ASSIGN_OR_RETURN(owned, io::PosixFile::Open(layout_.file, {.direct = true}));
    file = owned.get();
  }
  const ModelConfig& c = model_->config();
  for (int il = 0; il < c.n_layer; ++il) {
    if (ordinal_of_block_[il] < 0) continue;  // a dense block
    const io::PackedLayerInfo& li = layout_.layers[ordinal_of_block_[il]];
    const uint64_t bytes = li.record_bytes * li.n_expert;
    AlignedPtr<uint8_t> buf = AllocAligned<uint8_t>(bytes, 4096);
    if (!buf)
      return Status::ResourceExhausted(fmt::format("{}: cannot allocate {} for the experts of layer {} (run with a "
                                                   "memory budget to stream them instead)", li.file, Mib(bytes), il));
    constexpr uint64_t kChunk = uint64_t{64} << 20;  // a multiple of 4096 (O_DIRECT)
    for (uint64_t off = 0; off < bytes; off += kChunk)
      ESTREAM_RETURN_IF_ERROR(file->ReadAt(li.file_offset + off, std::min(kChunk, bytes - off), buf.get() + off));
    ExpertWeights& ex = model_->layers_[il].experts;
    for (int p = 0; p < li.n_expert; ++p) {
      const uint8_t* rec = buf.get() + p * li.record_bytes;
      if (options_.verify_checksums) ESTREAM_RETURN_IF_ERROR(io::VerifyRecord(li, p, rec));
      const int e = li.permutation[p];
      ex.gate[e] = li.PartView(io::ExpertPart::kGate, rec);
      ex.up[e] = li.PartView(io::ExpertPart::kUp, rec);
      ex.down[e] = li.PartView(io::ExpertPart::kDown, rec);
    }
    model_->weight_bytes_ += bytes;
    model_->packed_.push_back(std::move(buf));
  }
  return Status::Ok();
}

Status VirtualExperts::Solve() {
  ESTREAM_RETURN_IF_ERROR(SolveBanks());
  uint64_t stride = 0;
  for (const io::PackedLayerInfo& li : layout_.layers) stride = std::max(stride, li.record_bytes);
  SolveCache(stride);
  return Status::Ok();
}

void VirtualExperts::SolveCache(uint64_t stride) {
  VirtualExpertsConfig& k = config_;
  const int64_t want = options_.expert_cache_bytes;
  k.cache_banks = 0;
  k.cache_bytes = 0;
  if (want == 0 || (want < 0 && (k.budget_bytes == 0 || options_.banks > 0))) return;
  const uint64_t bank = static_cast<uint64_t>(k.group_size) * stride;
  uint64_t room = std::numeric_limits<uint64_t>::max();
  if (k.budget_bytes > 0) {
    const uint64_t used = k.other_bytes + static_cast<uint64_t>(k.banks) * bank;
    room = k.budget_bytes > used ? k.budget_bytes - used : 0;
  }
  if (want > 0) room = std::min(room, static_cast<uint64_t>(want));
  const int n_groups = (model_->config().n_expert + k.group_size - 1) / k.group_size;
  const uint64_t all_groups = static_cast<uint64_t>(n_groups) * layout_.layers.size();
  k.cache_banks = static_cast<int>(std::min(room / bank, all_groups));
  k.cache_bytes = static_cast<uint64_t>(k.cache_banks) * bank;
}

Status VirtualExperts::SolveBanks() {
  const ModelConfig& c = model_->config();
  VirtualExpertsConfig& k = config_;
  k.budget_bytes = options_.budget_bytes;
  k.queue_depth = options_.queue_depth > 0 ? options_.queue_depth : 8;
  bool float_experts = false;
  for (const io::PackedLayerInfo& li : layout_.layers)
    for (const io::PackedPart& p : li.parts) float_experts = float_experts || !IsQuantized(p.type);
  const uint64_t rss = CurrentRssBytes();
  uint64_t stride = 0;
  for (const io::PackedLayerInfo& li : layout_.layers) stride = std::max(stride, li.record_bytes);
  const auto groups = [&](int g) { return (c.n_expert + g - 1) / g; };
  const auto other = [&](int64_t tokens, int threads) {
    return rss + ActivationBytes(c, tokens, threads, float_experts) + kBudgetMargin;
  };
  // Default pass length (see the header, "Pass length"): the longest long pass for which the
  // budget still holds the default rule's full arena with its activations, else the short one if
  // the budget holds the smallest workable arena beside it, else the longest shorter one that does.
  const bool default_pass = options_.budget_tokens <= 0;
  k.budget_tokens = default_pass ? std::min<int64_t>(c.n_ctx, kShortPassTokens) : options_.budget_tokens;
  if (default_pass && k.budget_bytes > 0) {
    const int g = std::min(8, c.n_expert);
    const uint64_t group = static_cast<uint64_t>(g) * stride;
    const auto fits = [&](int64_t tokens, uint64_t arena) {
      return other(tokens, options_.n_threads) + arena <= k.budget_bytes;
    };
    bool chosen = false;
    for (int64_t pass : kLongPassTokens) {
      if (c.n_ctx <= kShortPassTokens) break;
      const int64_t long_tokens = std::min<int64_t>(c.n_ctx, pass);
      if (fits(long_tokens, 2 * groups(g) * group)) {
        k.budget_tokens = long_tokens;  // > kShortPassTokens, as the context is
        chosen = true;
        break;
      }
    }
    if (!chosen && !fits(k.budget_tokens, 2 * group)) {
      k.budget_tokens = std::min<int64_t>(c.n_ctx, kMinPassTokens);  // refused below unless it fits
      for (int64_t pass : kShorterPassTokens) {
        if (!fits(std::min<int64_t>(c.n_ctx, pass), 2 * group)) continue;
        k.budget_tokens = std::min<int64_t>(c.n_ctx, pass);
        break;
      }
    }
  }
  k.other_bytes = other(k.budget_tokens, options_.n_threads);
  k.source = ConfigSource::kExplicit;
  if (k.budget_bytes == 0) {  // explicit sizes only
    k.group_size = options_.group_size > 0 ? options_.group_size : std::min(8, c.n_expert);
    k.banks = options_.banks > 0 ? options_.banks : 2;
    return Status::Ok();
  }
  // The load's own peak (see the header, "Budget"): a process peak from before the load (memory
  // the host program used and freed) is not the model's and must not refuse it.
  const uint64_t process_peak = PeakRssBytes();
  const bool load_set_peak = process_peak > options_.peak_rss_before_load;
  const uint64_t peak = load_set_peak ? process_peak : rss;
  const uint64_t minimum = k.other_bytes + stride;
  if (peak > k.budget_bytes || minimum > k.budget_bytes) {
    // Part of the activations is per compute thread (kernel tiles, attention scratch): with many
    // threads it can outweigh the prompt's share, and then fewer threads are the way to fit.
    const int n = options_.n_threads;
    const uint64_t threads_share = k.other_bytes - other(k.budget_tokens, 0);
    const uint64_t activations = k.other_bytes - rss - kBudgetMargin;
    int fits_with = 0;  // the most threads that would fit, 0: none below n
    if (peak <= k.budget_bytes)
      for (int t = n - 1; t >= 1 && fits_with == 0; --t)
        if (other(k.budget_tokens, t) + stride <= k.budget_bytes) fits_with = t;
    const bool threads_matter = n > 1 && peak <= k.budget_bytes && (fits_with > 0 || 2 * threads_share >= activations);
    const std::string threads_text =
        threads_matter ? fmt::format(" at {} threads, {} of it the threads' scratch", n, Mib(threads_share)) : "";
    const std::string pass_advice = default_pass ? "plan a pass shorter than the shortest one the default tries"
                                                 : "plan a shorter pass";
    const std::string advice =
        fits_with > 0 ? fmt::format("use fewer threads (up to {} fit: n_threads, -t), raise the budget, or {} "
                                    "(budget_tokens, --budget-tokens)", fits_with, pass_advice)
        : threads_matter ? fmt::format("raise the budget, use fewer threads (n_threads, -t), or {} (budget_tokens, "
                                       "--budget-tokens)", pass_advice)
                         : fmt::format("raise the budget, or {} (budget_tokens, --budget-tokens)", pass_advice);
    return Status::ResourceExhausted(fmt::format(
        "memory budget {} is too small for {}: {}, and the dense part plus the activations of a {}-token pass "
        "({}{}) plus one bank of one expert ({}) need at least {} ({:.0f} MiB); {}", BudgetText(k.budget_bytes),
        model_->path(),
        load_set_peak ? fmt::format("loading its dense part peaked at {}", Mib(peak))
                      : fmt::format("the process holds {} with its dense part loaded", Mib(peak)),
        k.budget_tokens, Mib(k.other_bytes), threads_text, Mib(stride), Mib(std::max(minimum, peak)),
        std::ceil(static_cast<double>(std::max(minimum, peak)) / (1 << 20)), advice));
  }
  const uint64_t avail = k.budget_bytes - k.other_bytes;
  if (options_.group_size > 0 || options_.banks > 0) {
    k.group_size = options_.group_size > 0 ? options_.group_size : std::min(8, c.n_expert);
    const uint64_t fit = avail / (k.group_size * stride);
    k.banks = options_.banks > 0 ? options_.banks : static_cast<int>(std::min<uint64_t>(fit, 2 * groups(k.group_size)));
    if (static_cast<uint64_t>(k.banks) * k.group_size * stride > avail || k.banks < 1)
      return Status::ResourceExhausted(fmt::format(
          "memory budget {}: {} banks of {} experts need {} but only {} is left after the dense part and the "
          "activations ({}); the minimum budget for this configuration is {}", BudgetText(k.budget_bytes),
          std::max(k.banks, 1), k.group_size, Mib(std::max(k.banks, 1) * k.group_size * stride), Mib(avail),
          Mib(k.other_bytes), Mib(k.other_bytes + std::max(k.banks, 1) * k.group_size * stride)));
    return Status::Ok();
  }
  if (SolveFromProfile(avail, stride)) return Status::Ok();
  for (int g = std::min(8, c.n_expert); g >= 1; --g) {
    const uint64_t fit = avail / (g * stride);
    if (fit >= 2 || (g == 1 && fit >= 1)) {
      k.group_size = g;
      k.banks = static_cast<int>(std::min<uint64_t>(fit, 2 * groups(g)));
      return Status::Ok();
    }
  }
  return Status::Internal("VirtualExperts::Solve: no configuration although one bank of one expert fits");
}

bool VirtualExperts::SolveFromProfile(uint64_t avail, uint64_t stride) {
  const ModelConfig& c = model_->config();
  VirtualExpertsConfig& k = config_;
  const std::vector<GgufKv>& kvs = model_->file().kvs();
  const Schedule schedule = options_.schedule;
  const int n_layer = static_cast<int>(layout_.layers.size());
  int g = 0, b = 0, q = 0;
  std::string note;
  // A stored profile is used only when it describes this model's layout (a file edited or
  // re-packed since profiling: ignored, with a note), and then so is the choice stored with it; a
  // stored choice only for the same budget and schedule, with sizes the loader accepts.
  constexpr int kMaxQueueDepth = 4096;  // io::Loader's limit
  std::optional<config::Profile> profile;
  if (config::HasProfile(kvs)) {
    Result<config::Profile> parsed = config::ParseProfile(kvs, model_->path());
    if (!parsed.ok()) {
      note = "stored profile ignored: " + parsed.status().message();
    } else if (parsed->n_layer != n_layer || parsed->n_expert != c.n_expert || parsed->expert_bytes != stride) {
      note = fmt::format("stored profile ignored: it describes {} MoE layers x {} experts of {} bytes, the model has "
                         "{} x {} of {}; run estream profile again", parsed->n_layer, parsed->n_expert,
                         parsed->expert_bytes, n_layer, c.n_expert, stride);
    } else {
      profile = std::move(*parsed);
    }
  }
  if ((profile || !config::HasProfile(kvs)) && config::HasConfigChoice(kvs)) {
    Result<config::ConfigChoice> choice = config::ParseConfigChoice(kvs, model_->path());
    if (!choice.ok()) {
      note = "stored configuration ignored: " + choice.status().message();
    } else if (choice->budget_bytes == k.budget_bytes && choice->schedule == schedule &&
               choice->group_size <= c.n_expert && choice->queue_depth <= kMaxQueueDepth) {
      g = choice->group_size, b = choice->banks, q = choice->queue_depth;
      k.source = ConfigSource::kStored;
    }
  }
  if (g == 0 && profile) {
    Result<config::Selection> sel =
        config::SelectConfig(*profile, {.budget_bytes = k.budget_bytes, .schedule = schedule});
    if (!sel.ok()) {
      note = "stored profile: " + sel.status().message();
    } else if (sel->best.queue_depth > kMaxQueueDepth) {
      note = fmt::format("stored profile ignored: queue depth {} is above the loader's {}", sel->best.queue_depth,
                         kMaxQueueDepth);
    } else {
      g = sel->best.group_size, b = sel->best.banks, q = sel->best.queue_depth;
      k.source = ConfigSource::kProfile;
    }
  }
  if (g == 0) {
    k.source = ConfigSource::kRule;
    k.source_note = note;
    return false;
  }
  const uint64_t fit = avail / (static_cast<uint64_t>(g) * stride);
  if (fit < 1) {
    k.source_note = fmt::format("{} configuration G={} B={} does not fit: {} left for the arena after the "
                                "measured non-arena memory {}", ConfigSourceName(k.source), g, b, Mib(avail),
                                Mib(k.other_bytes));
    k.source = ConfigSource::kRule;
    return false;
  }
  if (static_cast<uint64_t>(b) > fit) {
    k.source_note = fmt::format("banks {} -> {}: the measured non-arena memory {} is larger than the profile's", b, fit,
                            Mib(k.other_bytes));
    b = static_cast<int>(fit);
  }
  k.group_size = g;
  k.banks = b;
  k.queue_depth = options_.queue_depth > 0 ? options_.queue_depth : q;
  return true;
}

void VirtualExperts::BeginRequest() {
  expert_s_ = 0;
  streamer_->BeginRequest();
}

void VirtualExperts::LayerStart(int il) {
  layer_start_s_ = NowSeconds();
  streamer_->LayerStart(ordinal_of_block_[il]);
}

Status VirtualExperts::RunExperts(int il, int64_t n_tokens, Workspace* ws) {
  const double t_enter = NowSeconds();
  const ModelConfig& c = model_->config();
  const int ord = ordinal_of_block_[il];
  const vmem::ResidencyTable& table = streamer_->table();
  pipeline::TraceRecorder* trace = options_.trace;
  if (trace)
    trace->Add({.name = fmt::format("attention+router L{}", il), .category = "compute",
                .tid = pipeline::kComputeTid, .start_s = layer_start_s_, .dur_s = t_enter - layer_start_s_,
                .args = {{"layer", il}}, .step = pipeline::TraceStep::kAttentionRouter});
  const std::vector<int64_t>& begin = ws->expert_begin;
  std::vector<uint8_t> active(table.n_groups(), 0);
  std::vector<int64_t> routes(table.n_groups(), 0);  // the expert cache's score
  for (int e = 0; e < c.n_expert; ++e) {
    const int q = table.GroupOf(ord, e).group;
    routes[q] += begin[e + 1] - begin[e];
    if (begin[e + 1] > begin[e]) active[q] = 1;
  }
  streamer_->RoutingKnown(ord, active, &routes);
  if (n_tokens * c.n_expert_used > group_capacity_)
    return Status::ResourceExhausted(fmt::format("prompt of {} tokens is longer than the {} tokens the memory budget "
                                                 "was planned for", n_tokens, config_.budget_tokens));
  const io::PackedLayerInfo& li = layout_.layers[ord];
  const int G = config_.group_size;
  // Every group's invocation adds into the layer's fp64 sum; x gets it once, after the last group
  // (expert_op.h, "Order of the experts": the order of groups and slots then does not matter).
  moe::BeginExpertSum(ws->x.get(), n_tokens, c.n_embd, ws->acc.get());
  Status status;
  std::vector<pipeline::GroupLease> leases;
  struct Rec { int lease, r; };
  std::vector<Rec> recs;
  int q = 0;
  while (q < table.n_groups() && status.ok()) {
    if (!active[q]) {
      ++q;
      continue;
    }
    // The next active group (waiting for it: bubble), then every following active group that
    // is already loaded: one operator invocation for all of them (fewer parallel regions).
    leases.clear();
    Result<pipeline::GroupLease> first = streamer_->AcquireGroup(ord, q);
    if (!first.ok()) {
      status = first.status();
      break;
    }
    leases.push_back(*first);
    int next = q + 1;
    for (; next < table.n_groups(); ++next) {
      if (!active[next]) continue;
      std::optional<pipeline::GroupLease> more = streamer_->TryAcquireGroup(ord, next);
      if (!more) break;
      leases.push_back(*more);
    }
    const double t0 = NowSeconds();
    recs.clear();
    for (int i = 0; i < static_cast<int>(leases.size()); ++i)
      for (int r = 0; r < table.ExpertsInGroup(leases[i].group); ++r) recs.push_back({i, r});
    const int n_rec = static_cast<int>(recs.size());
    if (options_.verify_checksums) {
      // Every record, in parallel over records (distinct elements of `checks`).
      std::vector<Status> checks(n_rec);
#pragma omp parallel for schedule(dynamic, 1)
      for (int i = 0; i < n_rec; ++i) {
        const int p = leases[recs[i].lease].group * G + recs[i].r;
        uint8_t& done = verified_[static_cast<size_t>(ord) * c.n_expert + p];  // distinct per i
        if (done && !options_.verify_every_read) continue;
        checks[i] = io::VerifyRecord(li, p, streamer_->RecordAddress(leases[recs[i].lease], li.permutation[p]));
        done = checks[i].ok();
      }
      for (const Status& cs : checks)
        if (!cs.ok() && status.ok()) status = cs;
      if (trace)
        trace->Add({.name = fmt::format("verify L{} g{}-{}", il, q, leases.back().group), .category = "verify",
                    .tid = pipeline::kComputeTid, .start_s = t0, .dur_s = NowSeconds() - t0,
                    .args = {{"layer", il}, {"groups", static_cast<int64_t>(leases.size())}},
                    .step = pipeline::TraceStep::kVerify});
    }
    int64_t n = 0;
    if (status.ok()) {
      // The routes as a CSR by slot (slots in group order, then position r in the group: the
      // physical record order), and the slots' bindings into the banks. With the identity
      // permutation the slots are in expert order, so every row receives its experts in the
      // same order as in the resident run (bit-identical results, expert_op.h); with another
      // permutation the order differs, which the fp64 sum makes invisible but for rare ties.
      for (int i = 0; i < n_rec; ++i) {
        const pipeline::GroupLease& lease = leases[recs[i].lease];
        const int e = li.permutation[lease.group * G + recs[i].r];
        slot_begin_[i] = n;
        const int64_t r0 = begin[e], r1 = begin[e + 1];
        std::copy(ws->route_token.get() + r0, ws->route_token.get() + r1, group_token_.get() + n);
        std::copy(ws->route_w.get() + r0, ws->route_w.get() + r1, group_w_.get() + n);
        n += r1 - r0;
        const uint8_t* rec = streamer_->RecordAddress(lease, e);
        bindings_[i] = {li.PartView(io::ExpertPart::kGate, rec), li.PartView(io::ExpertPart::kUp, rec),
                        li.PartView(io::ExpertPart::kDown, rec)};
      }
      slot_begin_[n_rec] = n;
      moe::ExpertPlan* plan = nullptr;
      const moe::ExpertShape shape = moe::ExpertShape::Of(bindings_[0].gate, bindings_[0].up, bindings_[0].down);
      for (moe::ExpertPlan& p : plans_)
        if (p.shape() == shape) plan = &p;
      ESTREAM_CHECK(plan != nullptr, "VirtualExperts: no plan for a layer's shape class");
      status = plan->Invoke({.slot_begin = slot_begin_.data(), .n_slots = n_rec, .route_token = group_token_.get(),
                             .route_weight = group_w_.get(), .bindings = bindings_.data(), .xn = ws->xn.get(),
                             .xq = ws->xq.get(), .acc = ws->acc.get(), .n_tokens = n_tokens});
    }
    if (options_.hooks && options_.hooks->max_executor_delay_s > 0) {
      rng_state_ = rng_state_ * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(rng_state_ >> 11) / static_cast<double>(uint64_t{1} << 53);
      std::this_thread::sleep_for(std::chrono::duration<double>(u * options_.hooks->max_executor_delay_s));
    }
    const double t1 = NowSeconds();
    if (trace)
      trace->Add({.name = fmt::format("experts L{} g{}-{}", il, q, leases.back().group), .category = "compute",
                  .tid = pipeline::kComputeTid, .start_s = t0, .dur_s = t1 - t0,
                  .args = {{"layer", il}, {"groups", static_cast<int64_t>(leases.size())},
                           {"first_bank", leases.front().bank}, {"routes", n}},
                  .step = pipeline::TraceStep::kExperts});
    for (const pipeline::GroupLease& l : leases) streamer_->ReleaseGroup(l);
    q = next;
  }
  if (status.ok()) moe::EndExpertSum(ws->acc.get(), n_tokens, c.n_embd, ws->x.get());
  expert_s_ += NowSeconds() - t_enter;
  return status;
}

Status VirtualExperts::EndRequest() { return streamer_->EndRequest(); }

pipeline::StreamStats VirtualExperts::stream_stats() const { return streamer_->stats(); }

}  // namespace estream::model

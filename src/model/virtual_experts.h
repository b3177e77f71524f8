// VirtualExperts: the experts of a packed model (`estream pack`, io/packed_layout.h), either
// all resident (read once from the records into memory) or streamed through a bounded arena
// within a memory budget (docs/DESIGN.md sections 4-6; pipeline/expert_stream.h does the I/O side).
//
// Resident (budget_bytes == 0 and no explicit group size / banks): Open reads every record with
// O_DIRECT (no page cache), checks its checksum, and points the model's expert views at it; the
// engine then runs exactly as on a GGUF model. streamed() is false.
//
// Streamed: Open sizes the arena (see Solve below), creates the ExpertStreamer and leaves the
// model's expert views without data; per request the engine calls BeginRequest, then per layer
// LayerStart(il) before the attention and RunExperts(il) after the router, and EndRequest at
// the end (also after an error). RunExperts runs the layer's active groups in ascending group
// order, each from its bank, with one invocation of the fused expert operator (moe/expert_op.h)
// whose slots are the group's arena slots, all adding into the layer's fp64 sum (ws->acc) that is
// rounded into x once after the last group: with the identity permutation the experts are added
// into every row in expert order exactly as in the resident run, so the outputs are
// bit-identical to it; with another permutation only the order of the fp64 adds differs, which
// changes the rounded fp32 result only in rare ties (expert_op.h, "Order of the experts").
//
// Checksums: with verify_checksums, every record of a group (each only the first time it is read,
// unless verify_every_read) is checked (XXH3, in parallel over
// the group's records on the compute threads) before its experts run; a mismatch fails the
// request with VerifyRecord's error (file, block, expert, record, file offset).
//
// Budget (Solve): the memory of everything but the arena is measured, not guessed: the RSS after
// the model's dense part is loaded (weights, metadata, tokenizer, code), plus the activations of
// a prompt of `budget_tokens` tokens (ActivationBytes, an upper bound), plus a margin
// (kBudgetMargin). The arena gets the rest, and (G, B, Q) come from, in this order:
//   1. explicit group_size / banks (queue_depth: explicit, else 8)          kExplicit        
//   2. the configurator's stored choice (estream.config.*, `estream profile`) when it was solved
//      for this budget and schedule                                          kStored        
//   3. the stored profile (estream.profile.*) re-solved for this budget and schedule
//      (config::SelectConfig, a few milliseconds)                              kProfile        
//   4. the default rule: Q = 8 and the largest G <= 8 for which B >= 2 banks fit (B capped at
//      two layers' worth of groups)                                          kRule        
// For 2 and 3 an explicit queue_depth still overrides Q, and the choice must pass this process's
// own fit check: when the measured non-arena memory is larger than the profile's (a longer
// budget_tokens, say), B is lowered to what fits; when not even one bank of G fits, the rule
// (4) decides. A stored choice or profile that does not parse is ignored (source_note says why).
// A budget below the load's own peak or below other + one bank of one expert is refused with
// ResourceExhausted giving the minimum. The load's own peak is the process's peak RSS (VmHWM) when
// the load raised it above peak_rss_before_load; when it did not (the host process used and freed
// more memory before, e.g. a Python program's freed arrays), the load stayed under that earlier
// peak, which is not the load's: its figure is then the RSS it left, as other counts it (the
// kernel's peak reset, /proc/self/clear_refs, is not used: it would change the process's VmHWM
// and ru_maxrss under the host program). Then the expert cache (SolveCache) gets every whole
// bank of G experts the budget still leaves (auto), capped by expert_cache_bytes and by the
// model's number of groups: other + (B + C) x G x stride <= budget.
// Streamed, the engine ends every pass with EndRequest, but the expert cache's banks keep their
// groups from one pass to the next (pipeline/expert_stream.h, "Expert cache").
//
// Ownership: VirtualExperts borrows the Model (it must outlive it) and writes its expert views.
// Thread safety: one request at a time (the engine's mutex); called outside OpenMP regions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/status.h"
#include "estream/engine.h"
#include "estream/options.h"
#include "io/file.h"
#include "io/loader.h"
#include "pack/packed_layout.h"
#include "model/blocks.h"
#include "model/model.h"
#include "moe/expert_op.h"
#include "pipeline/expert_stream.h"
#include "pipeline/trace.h"

namespace estream::model {

// Pass length (budget_tokens) when none is given: the activations of a pass are planned into the
// budget, so a longer pass leaves a smaller arena, but every pass reads each active expert once:
// a batch of 64 prompts of 128 tokens in one pass of 8192 tokens reads the experts half as often
// as in two passes of 4096 (docs/PERFORMANCE.md, "Budgeted batch: one pass of 8192 tokens").
// Default: the longest of min(context, kLongPassTokens[i]) for which the budget still holds,
// beside those activations, the default rule's largest arena (2 MoE layers' worth of groups of
// min(8, experts) experts), else min(context, kShortPassTokens). Longer than 8192 where the budget
// allows: 64 prompts of 128 tokens and their BOS are 8256 tokens, so a pass of 8192 split them
// 63 + 1 and the last prompt read every expert again on its own (a server's 64 clients: one of
// them waited a pass each round). The activations beyond 8192 tokens come out of the expert cache
// (the budget's leftover; on Qwen3-30B-A3B at 3G it held 3% of a 128-token request's experts).
// A budget too small for min(context, kShortPassTokens) beside the smallest workable arena (two
// banks of min(8, experts) experts: one group read while another computes) gets the longest of
// min(context, kShorterPassTokens[i]) that leaves it, down to kMinPassTokens, so that a budget
// that runs a short prompt through `estream prefill` (which plans for the prompt's length) also
// loads through the library; Engine::pass_tokens() reports the choice. Only a budget that does
// not hold kMinPassTokens' activations and one expert is refused (with budget_tokens named).
constexpr int64_t kShortPassTokens = 4096;
constexpr int64_t kMinPassTokens = 128;
constexpr int64_t kShorterPassTokens[] = {2048, 1024, 512, 256, kMinPassTokens};
constexpr int64_t kLongPassTokens[] = {16384, 12288, 8192};

// Margin on top of the measured and estimated memory: allocator slack, thread stacks touched,
// the response's vectors.
constexpr uint64_t kBudgetMargin = uint64_t{24} << 20;

// The engine's options (budget, G, B, Q, schedule, io, checksums, budget_tokens, test hooks:
// estream/engine.h), with n_threads resolved (>= 1) and the engine's trace recorder.
struct VirtualExpertsOptions : EngineOptions {
  pipeline::TraceRecorder* trace = nullptr;  // not owned; may be null
  // The process's peak RSS (PeakRssBytes) before the model's dense part was loaded; 0: unknown
  // (the load's peak is then the process's). See "Budget" above.
  uint64_t peak_rss_before_load = 0;
};

// Upper bound of the activation memory of one request of n_tokens tokens with n_threads threads
// (the Workspace, the engine's final hidden states and logits chunk, the group route buffers).
uint64_t ActivationBytes(const ModelConfig& c, int64_t n_tokens, int n_threads, bool float_experts);

struct VirtualExpertsConfig {
  bool streamed = false;
  int group_size = 0, banks = 0, queue_depth = 0;
  int cache_banks = 0;         // expert cache: banks beyond `banks` (EngineOptions::expert_cache_bytes)
  uint64_t cache_bytes = 0;    // cache_banks x group_size x slot stride
  Schedule schedule = Schedule::kEarly;
  std::string io_backend;      // "io_uring" / "pread" (streamed only)
  uint64_t arena_bytes = 0;    // (banks + cache_banks) x group_size x slot stride
  uint64_t expert_bytes = 0;   // all records of all layers
  uint64_t budget_bytes = 0;
  uint64_t other_bytes = 0;    // measured RSS after load + activations + margin
  int64_t budget_tokens = 0;
  // How G, B, Q were chosen (see Budget above), and a note when the choice was adjusted or a
  // stored one was ignored (empty otherwise).
  ConfigSource source = ConfigSource::kExplicit;
  std::string source_note;
};

class VirtualExperts {
 public:
  // REQUIRES: model->experts_packed(). Errors: those of ReadPackedLayout (unknown layout
  // version: NotSupported), IOError/Corruption reading records (resident), ResourceExhausted
  // (budget too small, with the minimum), InvalidArgument (bad explicit sizes).
  static Result<std::unique_ptr<VirtualExperts>> Open(Model* model, const VirtualExpertsOptions& options);
  ~VirtualExperts();

  bool streamed() const { return config_.streamed; }
  const VirtualExpertsConfig& config() const { return config_; }

  // ---- streamed only ----
  void BeginRequest();
  void LayerStart(int il);
  // ws holds layer il's routes (RouteBlock). Adds the experts' outputs into ws->x, summed over
  // all groups in fp64 in ws->acc and rounded into x once at the end. On error the request must
  // end (EndRequest); ws->x is then left as it was before the layer's experts.
  Status RunExperts(int il, int64_t n_tokens, Workspace* ws);
  Status EndRequest();
  pipeline::StreamStats stream_stats() const;
  double expert_seconds() const { return expert_s_; }
  const pipeline::ExpertStreamer* streamer() const { return streamer_.get(); }

 private:
  VirtualExperts() = default;
  Status LoadResident();
  Status Solve();
  Status SolveBanks();
  // The expert cache's banks from what the budget leaves (EngineOptions::expert_cache_bytes).
  void SolveCache(uint64_t stride);
  // Steps 2 and 3 of Solve: true when the stored choice or profile gave a configuration that
  // fits `avail` bytes of arena (slot stride `stride`); else false with config_.source's note.
  bool SolveFromProfile(uint64_t avail, uint64_t stride);

  Model* model_ = nullptr;
  VirtualExpertsOptions options_;
  VirtualExpertsConfig config_;
  io::PackedModelInfo layout_;
  std::vector<int> ordinal_of_block_;  // block index -> MoE layer ordinal of the layout
  std::unique_ptr<pipeline::ExpertStreamer> streamer_;
  // Group route CSR (restricted to one group's experts), swapped into the Workspace per group.
  AlignedPtr<int32_t> group_token_;   // [capacity]
  AlignedPtr<float> group_w_;         // [capacity]
  int64_t group_capacity_ = 0;
  std::vector<int64_t> slot_begin_;          // [n_expert + 1] CSR by slot of one group
  std::vector<moe::SlotBinding> bindings_;   // [n_expert] slot -> views into the bank
  std::vector<moe::ExpertPlan> plans_;       // one per expert shape class
  std::vector<uint8_t> verified_;            // [ordinal * n_expert + physical record]: checksum ok once
  double expert_s_ = 0;
  double layer_start_s_ = 0;
  uint64_t rng_state_ = 1;
};

}  // namespace estream::model

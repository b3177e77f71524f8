#include "config/maxplus.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace estream::config {

int PipelineInput::MaxLayerGroups() const {
  uint32_t most = 0;
  for (size_t w = 0; w + 1 < layer_begin.size(); ++w) most = std::max(most, layer_begin[w + 1] - layer_begin[w]);
  return static_cast<int>(most);
}

Status PipelineInput::Validate() const {
  auto bad_time = [](double t) { return !std::isfinite(t) || t < 0; };
  const size_t n = read_s.size();
  if (layer_begin.size() != nonexpert_s.size() + 1) {
    return Status::InvalidArgument(fmt::format("pipeline input: layer_begin has {} entries, want n_layer + 1 = {}",
                                               layer_begin.size(), nonexpert_s.size() + 1));
  }
  if (transfer_s.size() != n || exec_s.size() != n) {
    return Status::InvalidArgument(fmt::format("pipeline input: read_s/transfer_s/exec_s sizes {}/{}/{} differ", n,
                                               transfer_s.size(), exec_s.size()));
  }
  if (layer_begin.front() != 0 || layer_begin.back() != n) {
    return Status::InvalidArgument(
        fmt::format("pipeline input: layer_begin must run from 0 to the group count {}", n));
  }
  for (size_t w = 0; w < nonexpert_s.size(); ++w) {
    if (layer_begin[w + 1] < layer_begin[w]) {
      return Status::InvalidArgument(fmt::format("pipeline input: layer_begin decreases at layer {}", w));
    }
    if (bad_time(nonexpert_s[w])) {
      return Status::InvalidArgument(fmt::format("pipeline input: nonexpert_s[{}] = {} is not a time >= 0", w,
                                                 nonexpert_s[w]));
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (bad_time(read_s[j]) || bad_time(transfer_s[j]) || bad_time(exec_s[j]) || transfer_s[j] > read_s[j]) {
      return Status::InvalidArgument(fmt::format(
          "pipeline input: group {}: read {} / transfer {} / exec {} s (want finite, >= 0, transfer <= read)", j,
          read_s[j], transfer_s[j], exec_s[j]));
    }
  }
  if (bad_time(other_s)) {
    return Status::InvalidArgument(fmt::format("pipeline input: other_s = {} is not a time >= 0", other_s));
  }
  return Status::Ok();
}

namespace {

// One pass of the recurrence (maxplus.h). With kTrace, every intermediate is recorded.
template <bool kTrace>
PipelinePrediction Run(const PipelineInput& in, const PipelineParams& p, std::vector<double>& d,
                       std::vector<double>& f, PipelineTrace* trace) {
  ESTREAM_CHECK(p.banks >= 1 && p.queue_depth >= 1, "EvaluatePipeline: banks and queue_depth must be >= 1");
  ESTREAM_DCHECK(in.Validate().ok(), "EvaluatePipeline: invalid PipelineInput (call Validate first)");
  const int n_layer = in.n_layer();
  const size_t n = in.read_s.size();
  if (d.size() < n) d.resize(n);
  if (f.size() < n) f.resize(n);
  const size_t q = static_cast<size_t>(p.queue_depth);
  const size_t b = static_cast<size_t>(p.banks);
  const bool per_layer_release = p.schedule == Schedule::kEarly && !p.cross_layer;

  PipelinePrediction out;
  double t0 = 0;       // start of the current layer
  double d_prev = 0;   // d_{j-1}
  double f_prev = 0;   // f_{j-1}
  double wait = 0, exec_sum = 0, ne_sum = 0;
  for (int w = 0; w < n_layer; ++w) {
    const double e = t0 + in.nonexpert_s[w];
    ne_sum += in.nonexpert_s[w];
    double release;  // R_j for every group of this layer (kOnDemand adds f_{j-1} below)
    switch (p.schedule) {
      case Schedule::kEarly: release = per_layer_release ? t0 : 0; break;
      default: release = e; break;
    }
    const size_t end = in.layer_begin[w + 1];
    for (size_t j = in.layer_begin[w]; j < end; ++j) {
      double a = release;
      if (p.schedule == Schedule::kOnDemand) a = std::max(a, f_prev);
      if (j >= q) a = std::max(a, d[j - q]);
      if (j >= b) a = std::max(a, f[j - b]);
      const double dj = std::max(a + in.read_s[j], d_prev + in.transfer_s[j]);
      const double ready = std::max(e, f_prev);  // when the cores could start this group
      const double s = std::max(dj, ready);
      const double fj = s + in.exec_s[j];
      wait += s - ready;
      exec_sum += in.exec_s[j];
      d[j] = dj;
      f[j] = fj;
      if constexpr (kTrace) {
        trace->a[j] = a;
        trace->d[j] = dj;
        trace->s[j] = s;
        trace->f[j] = fj;
      }
      d_prev = dj;
      f_prev = fj;
    }
    if constexpr (kTrace) trace->layer_start[w] = t0;
    // f_prev is this layer's last group (or an earlier layer's, which is <= t0 <= e).
    t0 = std::max(e, f_prev);
    if constexpr (kTrace) trace->layer_end[w] = t0;
  }
  out.total_s = t0 + in.other_s;
  out.wait_s = wait;
  out.expert_exec_s = exec_sum;
  out.nonexpert_s = ne_sum;
  return out;
}

}  // namespace

PipelinePrediction EvaluatePipeline(const PipelineInput& input, const PipelineParams& params,
                                    PipelineWorkspace* workspace) {
  return Run<false>(input, params, workspace->d, workspace->f, nullptr);
}

PipelineTrace TracePipeline(const PipelineInput& input, const PipelineParams& params) {
  PipelineTrace t;
  const size_t n = input.read_s.size();
  t.a.resize(n);
  t.d.resize(n);
  t.s.resize(n);
  t.f.resize(n);
  t.layer_start.resize(input.nonexpert_s.size());
  t.layer_end.resize(input.nonexpert_s.size());
  std::vector<double> d, f;
  t.prediction = Run<true>(input, params, d, f, &t);
  return t;
}

}  // namespace estream::config

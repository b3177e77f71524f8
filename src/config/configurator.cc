#include "config/configurator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace estream::config {

Result<AffineFit> FitAffine(const std::vector<float>& rows, const std::vector<float>& seconds) {
  if (rows.empty() || rows.size() != seconds.size()) {
    return Status::InvalidArgument(fmt::format("FitAffine: {} rows and {} times: need equal, non-zero counts",
                                               rows.size(), seconds.size()));
  }
  const size_t n = rows.size();
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(rows[i]) || !std::isfinite(seconds[i]) || rows[i] < 0 || seconds[i] < 0) {
      return Status::InvalidArgument(
          fmt::format("FitAffine: sample {} ({} rows, {} s) is not finite and >= 0", i, rows[i], seconds[i]));
    }
    mx += rows[i];
    my += seconds[i];
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  // Centred sums: no cancellation when rows are large and spread little.
  double sxx = 0, sxy = 0, xx = 0, xy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double dx = rows[i] - mx, dy = seconds[i] - my;
    sxx += dx * dx;
    sxy += dx * dy;
    xx += static_cast<double>(rows[i]) * rows[i];
    xy += static_cast<double>(rows[i]) * seconds[i];
  }
  AffineFit fit{.intercept_s = my, .slope_s = 0};
  if (sxx <= 0 || sxy <= 0) return fit;  // one distinct x, or no positive trend: the mean
  fit.slope_s = sxy / sxx;
  fit.intercept_s = my - fit.slope_s * mx;
  if (fit.intercept_s < 0) fit = {.intercept_s = 0, .slope_s = xx > 0 ? xy / xx : 0};
  return fit;
}

int GroupsInFlight(int queue_depth, uint64_t chunk_bytes, uint64_t group_bytes) {
  if (chunk_bytes == 0 || queue_depth < 1) return 1;
  const uint64_t chunks = std::max<uint64_t>(1, (group_bytes + chunk_bytes - 1) / chunk_bytes);
  return static_cast<int>(std::max<uint64_t>(1, static_cast<uint64_t>(queue_depth) / chunks));
}

Result<ServiceModel> MakeServiceModel(const Profile& profile, int group_size, int queue_depth) {
  const CalibrationRun* run = profile.Run(group_size);
  if (run == nullptr) {
    return Status::InvalidArgument(
        fmt::format("group size {} was not calibrated (the profile has {} runs); run `estream profile` with it",
                    group_size, profile.runs.size()));
  }
  if (queue_depth < 1) return Status::InvalidArgument(fmt::format("queue depth {} must be >= 1", queue_depth));
  ServiceModel m;
  m.group_size = group_size;
  m.queue_depth = queue_depth;
  const uint64_t record = *std::max_element(profile.record_bytes.begin(), profile.record_bytes.end());
  m.groups_in_flight = GroupsInFlight(queue_depth, profile.disk.chunk_bytes, static_cast<uint64_t>(group_size) * record);
  m.bandwidth = profile.disk.Bandwidth(group_size, queue_depth);
  m.latency_s = profile.disk.Latency(group_size);
  if (!run->load_seconds.empty()) {
    std::vector<float> loads = run->load_seconds;
    const size_t mid = loads.size() / 2;
    std::nth_element(loads.begin(), loads.begin() + static_cast<ptrdiff_t>(mid), loads.end());
    double median = loads[mid];
    if (loads.size() % 2 == 0) {
      median = 0.5 * (median + *std::max_element(loads.begin(), loads.begin() + static_cast<ptrdiff_t>(mid)));
    }
    const double mean_record =
        static_cast<double>(std::accumulate(profile.record_bytes.begin(), profile.record_bytes.end(), uint64_t{0})) /
        static_cast<double>(profile.n_layer);
    const double modelled =
        group_size * mean_record / profile.disk.Bandwidth(group_size, run->load_queue_depth);
    m.load_scale = median / modelled;
  }
  ESTREAM_ASSIGN_OR_RETURN(m.exec, FitAffine(run->exec_rows, run->exec_seconds));
  return m;
}

void BuildPipelineInput(const Profile& profile, const ServiceModel& model, PipelineInput* out) {
  const int g = model.group_size;
  const int n_expert = profile.n_expert;
  const int n_groups = (n_expert + g - 1) / g;
  out->nonexpert_s.assign(profile.nonexpert_seconds.begin(), profile.nonexpert_seconds.end());
  out->layer_begin.assign(1, 0);
  out->read_s.clear();
  out->transfer_s.clear();
  out->exec_s.clear();
  out->other_s = profile.other_seconds;
  for (int w = 0; w < profile.n_layer; ++w) {
    const uint32_t* routes = profile.expert_routes.data() + static_cast<size_t>(w) * n_expert;
    for (int k = 0; k < n_groups; ++k) {
      const int e0 = k * g, e1 = std::min(e0 + g, n_expert);
      uint64_t rho = 0;
      for (int e = e0; e < e1; ++e) rho += routes[e];
      if (rho == 0) continue;  // inactive: neither read nor executed
      const uint64_t bytes = static_cast<uint64_t>(e1 - e0) * profile.record_bytes[static_cast<size_t>(w)];
      out->read_s.push_back(model.ReadSeconds(bytes));
      out->transfer_s.push_back(model.TransferSeconds(bytes));
      out->exec_s.push_back(model.exec.At(static_cast<double>(rho)));
    }
    out->layer_begin.push_back(static_cast<uint32_t>(out->read_s.size()));
  }
}

MinimumBudgetInfo MinimumBudget(const Profile& profile, const std::vector<int>& group_sizes) {
  MinimumBudgetInfo best{.bytes = UINT64_MAX, .group_size = 0};
  for (const CalibrationRun& run : profile.runs) {
    if (!group_sizes.empty() && std::find(group_sizes.begin(), group_sizes.end(), run.group_size) == group_sizes.end()) {
      continue;
    }
    const unsigned __int128 need =
        static_cast<unsigned __int128>(run.other_bytes) + static_cast<unsigned __int128>(run.group_size) * profile.expert_bytes;
    const uint64_t bytes = need > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(need);
    if (bytes < best.bytes) best = {.bytes = bytes, .group_size = run.group_size};
  }
  return best;
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Evaluations of one (g, q) for varying b, with the input built once.
class BankSearch {
 public:
  BankSearch(const Profile& profile, const ServiceModel& model, const SelectParams& params)
      : profile_(profile), model_(model), params_(params) {
    BuildPipelineInput(profile, model, &input_);
    const CalibrationRun* run = profile.Run(model.group_size);
    other_bytes_ = run->other_bytes;
    bank_bytes_ = static_cast<uint64_t>(model.group_size) * profile.expert_bytes;
  }

  // Banks beyond this change nothing (maxplus.h, Properties).
  int UsefulBanks() const {
    const bool cross = params_.schedule == Schedule::kEarly && params_.cross_layer;
    return std::max(1, cross ? input_.n_groups() : input_.MaxLayerGroups());
  }

  CandidatePrediction Evaluate(int banks) {
    ++evaluations_;
    const PipelinePrediction p = EvaluatePipeline(
        input_,
        {.banks = banks, .queue_depth = model_.groups_in_flight, .schedule = params_.schedule, .cross_layer = params_.cross_layer},
        &workspace_);
    CandidatePrediction c;
    c.group_size = model_.group_size;
    c.queue_depth = model_.queue_depth;
    c.banks = banks;
    c.arena_bytes = static_cast<uint64_t>(banks) * bank_bytes_;
    c.total_bytes = c.arena_bytes + other_bytes_;
    c.predicted_s = p.total_s;
    c.wait_s = p.wait_s;
    return c;
  }

  // The smallest b in [1, cap] within (1 + tolerance) of the prediction at cap.
  CandidatePrediction Best(int cap) {
    if (params_.exhaustive) {
      std::vector<CandidatePrediction> all;
      all.reserve(static_cast<size_t>(cap));
      double least = INFINITY;
      for (int b = 1; b <= cap; ++b) {
        all.push_back(Evaluate(b));
        least = std::min(least, all.back().predicted_s);
      }
      for (const CandidatePrediction& c : all) {
        if (c.predicted_s <= least * (1 + params_.tolerance)) return c;
      }
      return all.back();  // unreachable
    }
    CandidatePrediction hi = Evaluate(cap);
    const double target = hi.predicted_s * (1 + params_.tolerance);
    int lo = 1;
    while (lo < hi.banks) {
      const int mid = lo + (hi.banks - lo) / 2;
      CandidatePrediction c = Evaluate(mid);
      if (c.predicted_s <= target) {
        hi = c;
      } else {
        lo = mid + 1;
      }
    }
    return hi;
  }

  int evaluations() const { return evaluations_; }

 private:
  const Profile& profile_;
  ServiceModel model_;
  const SelectParams& params_;
  PipelineInput input_;
  PipelineWorkspace workspace_;
  uint64_t other_bytes_ = 0;
  uint64_t bank_bytes_ = 0;
  int evaluations_ = 0;
};

// b_max(g) under the budget (0 when not even one bank fits), clamped to INT_MAX.
int MaxBanks(const Profile& profile, const CalibrationRun& run, uint64_t budget) {
  const unsigned __int128 bank = static_cast<unsigned __int128>(run.group_size) * profile.expert_bytes;
  if (budget < run.other_bytes) return 0;
  const unsigned __int128 b = (budget - run.other_bytes) / bank;
  return b > INT_MAX ? INT_MAX : static_cast<int>(b);
}

}  // namespace

Result<Selection> SelectConfig(const Profile& profile, const SelectParams& params) {
  ESTREAM_RETURN_IF_ERROR(profile.Validate());
  if (!(params.tolerance >= 0) || !std::isfinite(params.tolerance)) {
    return Status::InvalidArgument(fmt::format("tolerance {} must be a finite number >= 0", params.tolerance));
  }
  if (!(params.choice_tolerance >= 0) || !std::isfinite(params.choice_tolerance)) {
    return Status::InvalidArgument(
        fmt::format("choice tolerance {} must be a finite number >= 0", params.choice_tolerance));
  }
  std::vector<int> sizes = params.group_sizes;
  if (sizes.empty()) {
    for (const CalibrationRun& r : profile.runs) sizes.push_back(r.group_size);
  }
  for (int g : sizes) {
    if (profile.Run(g) == nullptr) {
      std::vector<int> have;
      for (const CalibrationRun& r : profile.runs) have.push_back(r.group_size);
      return Status::InvalidArgument(fmt::format(
          "group size {} was not calibrated; the profile has runs for {}", g, fmt::join(have, ", ")));
    }
  }
  for (int q : params.queue_depths) {
    if (q < 1) return Status::InvalidArgument(fmt::format("queue depth {} must be >= 1", q));
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  Selection sel;
  for (int g : sizes) {
    const CalibrationRun& run = *profile.Run(g);
    const int b_max = MaxBanks(profile, run, params.budget_bytes);
    if (b_max < 1) continue;
    std::vector<int> depths = params.queue_depths;
    if (depths.empty()) {
      const int q0 = profile.disk.Q0(g);
      for (int q : profile.disk.queue_depths)
        if (q >= q0) depths.push_back(q);
    }
    std::sort(depths.begin(), depths.end());
    depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
    for (int q : depths) {
      ESTREAM_ASSIGN_OR_RETURN(ServiceModel model, MakeServiceModel(profile, g, q));
      BankSearch search(profile, model, params);
      int cap = std::min(b_max, search.UsefulBanks());
      if (params.max_banks > 0) cap = std::min(cap, params.max_banks);
      CandidatePrediction c = search.Best(cap);
      if (params.read_ahead_layers > 0) {  // read-ahead headroom (configurator.h)
        const int per_layer = (profile.n_expert + g - 1) / g;
        int want = std::min(b_max, params.read_ahead_layers * per_layer);
        if (params.max_banks > 0) want = std::min(want, params.max_banks);
        if (want > c.banks) c = search.Evaluate(want);
      }
      sel.per_group.push_back(c);
      sel.evaluations += search.evaluations();
    }
  }
  if (sel.per_group.empty()) {
    const MinimumBudgetInfo need = MinimumBudget(profile, sizes);
    const CalibrationRun& run = *profile.Run(need.group_size);
    return Status::ResourceExhausted(fmt::format(
        "memory budget {} bytes ({:.1f} MiB) fits no configuration: the smallest needs {} bytes ({:.1f} MiB) = "
        "non-arena memory M_other {} B + one bank of G = {} experts x W_e = {} B; give a budget of at least {} bytes",
        params.budget_bytes, params.budget_bytes / kMiB, need.bytes, need.bytes / kMiB, run.other_bytes,
        need.group_size, profile.expert_bytes, need.bytes));
  }

  double least = INFINITY;
  for (const CandidatePrediction& c : sel.per_group) least = std::min(least, c.predicted_s);
  const CandidatePrediction* best = nullptr;
  for (const CandidatePrediction& c : sel.per_group) {
    if (c.predicted_s > least * (1 + params.choice_tolerance)) continue;
    // per_group is ascending in (g, q): less memory, then the smaller g, then the deeper q.
    if (best == nullptr || c.total_bytes < best->total_bytes ||
        (c.total_bytes == best->total_bytes && c.group_size == best->group_size))
      best = &c;
  }
  sel.best = *best;

  // Neighbours for --report.
  const CalibrationRun& run = *profile.Run(sel.best.group_size);
  const int b_max = MaxBanks(profile, run, params.budget_bytes);
  auto predict = [&](int q, int b) -> Status {
    ESTREAM_ASSIGN_OR_RETURN(ServiceModel model, MakeServiceModel(profile, sel.best.group_size, q));
    BankSearch search(profile, model, params);
    sel.neighbours.push_back(search.Evaluate(b));
    sel.evaluations += search.evaluations();
    return Status::Ok();
  };
  if (sel.best.banks > 1) ESTREAM_RETURN_IF_ERROR(predict(sel.best.queue_depth, sel.best.banks - 1));
  if (sel.best.banks < b_max) ESTREAM_RETURN_IF_ERROR(predict(sel.best.queue_depth, sel.best.banks + 1));
  const std::vector<int>& qs = profile.disk.queue_depths;
  auto below = std::lower_bound(qs.begin(), qs.end(), sel.best.queue_depth);  // first >= Q*
  if (below != qs.begin()) ESTREAM_RETURN_IF_ERROR(predict(*(below - 1), sel.best.banks));
  auto above = std::upper_bound(qs.begin(), qs.end(), sel.best.queue_depth);  // first > Q*
  if (above != qs.end()) ESTREAM_RETURN_IF_ERROR(predict(*above, sel.best.banks));
  return sel;
}

Result<CandidatePrediction> PredictConfig(const Profile& profile, int group_size, int queue_depth, int banks,
                                          Schedule schedule, bool cross_layer) {
  ESTREAM_RETURN_IF_ERROR(profile.Validate());
  if (banks < 1) return Status::InvalidArgument(fmt::format("bank count {} must be >= 1", banks));
  ESTREAM_ASSIGN_OR_RETURN(ServiceModel model, MakeServiceModel(profile, group_size, queue_depth));
  SelectParams params{.schedule = schedule, .cross_layer = cross_layer};
  BankSearch search(profile, model, params);
  return search.Evaluate(banks);
}

ConfigChoice ToConfigChoice(const Selection& selection, const SelectParams& params) {
  return ConfigChoice{.group_size = selection.best.group_size,
                      .banks = selection.best.banks,
                      .queue_depth = selection.best.queue_depth,
                      .budget_bytes = params.budget_bytes,
                      .predicted_seconds = static_cast<float>(selection.best.predicted_s),
                      .schedule = params.schedule};
}

}  // namespace estream::config

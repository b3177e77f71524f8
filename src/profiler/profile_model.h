// ProfileModel: the auto-configurator's workflow on one packed model for one budget
// (docs/DESIGN.md section 7); `estream profile` is this call plus printing.
//
// First time on a packed model: characterise the disk (cached per device, disk.h), run one
// calibration request per candidate group size (calibrate.h), select (G, Q, B) for the budget
// with the max-plus model (config/configurator.h), and store the profile and the choice in the
// model (estream.profile.*, estream.config.*; in place). When the model already holds a profile
// (and recalibrate is false) it only re-solves for the new budget from the stored profile, in
// milliseconds, and stores the new choice. `estream prefill --budget M` then uses the stored
// choice, or re-solves from the profile. The profile and the choice record the compute threads
// the calibration ran with; a re-solve with another thread count uses the stored profile all the
// same and says so in one progress line.
//
// Report (ProfileModelParams::report): the chosen point and its neighbours run end to end
// (MeasureRun). Where the peak RSS cannot be reset (measure.h) each point's peak is the process's
// since it started (peak_rss_exact false, after a one-line warning), and within_budget is then
// only judged when that figure is within the budget (above it: unknown).
//
// Thread safety: one at a time per process (it measures the process's peak RSS).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "config/configurator.h"
#include "config/profile.h"
#include "estream/options.h"
#include "profiler/calibrate.h"
#include "profiler/calibration.h"
#include "profiler/disk.h"

namespace estream::profiler {

struct ProfileModelParams {
  std::string model_path;          // a packed model; the profile is stored in it
  uint64_t budget_bytes = 0;       // > 0
  std::string budget_text;         // the budget as the user wrote it (for suggested commands)
  std::string calib_path = {};     // calibration text; empty: the built-in text
  int calib_tokens = kDefaultCalibrationTokens;
  std::vector<int> groups = {};    // candidate group sizes; empty: DefaultGroupSizes
  bool refresh_disk = false;       // measure the disk again instead of using the per-device cache
  bool recalibrate = false;        // calibrate again even if the model holds a profile
  bool report = false;             // run the choice and its neighbours end to end
  int n_threads = 0;               // EngineOptions::n_threads
  IoBackend io = IoBackend::kAuto;
  ProgressFn progress{};           // progress and notes, one line each (may be empty)
};

// One end-to-end run of the report.
struct ReportPoint {
  std::string point;  // "chosen" or "neighbour"
  config::CandidatePrediction predicted;
  std::string error;  // non-empty: the point does not fit this process's budget check (not run)
  double seconds = 0;
  uint64_t peak_rss_bytes = 0;
  bool peak_rss_exact = true;
  double bubble_rate = 0;
  std::optional<bool> within_budget;  // unknown for a cumulative peak above the budget
};

struct ProfileModelResult {
  std::string model_path;
  uint64_t budget_bytes = 0;
  bool calibrated = false;           // false: re-solved from the stored profile
  config::Profile profile;
  config::Selection selection;
  config::ConfigChoice choice;       // as stored in the model
  config::MinimumBudgetInfo minimum;
  std::string disk_source = "stored profile";  // "measured", "cached" or "stored profile"
  double profile_seconds = 0, disk_seconds = 0, calibration_seconds = 0, solve_seconds = 0, store_seconds = 0;
  int threads = 0;                   // the thread count of this run (resolved)
  std::vector<CalibrationRunInfo> runs;  // when calibrated
  std::vector<ReportPoint> report;       // when asked for
  bool has_report = false;
};

// Errors: InvalidArgument (not a packed model: "run estream pack"; a group size the model or the
// stored profile lacks), IOError before any measuring when the model cannot be written
// (io::CheckUpdatable), the stored profile's parse error (with "run with --recalibrate"), the
// errors of CharacteriseDisk / Calibrate / SelectConfig (an infeasible budget: the minimum; a
// fresh profile is stored first so that another budget re-solves in milliseconds),
// StoreInModel's.
Result<ProfileModelResult> ProfileModel(const ProfileModelParams& params);

// The JSON of `estream profile --json` (one object, one line).
std::string ProfileModelJson(const ProfileModelResult& r);

}  // namespace estream::profiler

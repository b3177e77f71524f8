// EngineHooks (declared in include/estream/engine.h): what estream's own code injects into an
// Engine through EngineOptions::hooks: the tests' fault-injecting files and random delays, the
// calibration's trace recorder. Not for applications.
#pragma once

#include "estream/engine.h"
#include "io/file.h"
#include "pipeline/trace.h"

namespace estream {

struct EngineHooks {
  // Read the expert records of a packed model through this file instead of opening the model
  // again (not owned; must outlive the Engine). Tests wrap a file to inject faults.
  io::File* expert_file = nullptr;
  // The streamer's feeder sleeps uniformly in [0, max] before each bank reservation, and the
  // compute thread before each group, to shake out ordering bugs.
  double max_feeder_delay_s = 0;
  double max_executor_delay_s = 0;
  // Record the trace events of every request here (not owned; cleared at the start of each
  // request) in addition to EngineOptions::trace_path: profiler::Calibrate reads the typed
  // events instead of a trace file.
  pipeline::TraceRecorder* trace = nullptr;
};

}  // namespace estream

#pragma once

// A profiler summary of a few steps (varuna-worker --trace_steps N, written into the
// --timeline_out file): where the time went by kernel category, with copies and host syncs
// (Note [Step trace] in step_trace.cc). ("profile" is AutoConfig's word: worker/engine/profiler.h.)
//
//   ASSIGN_OR_RETURN(auto trace, StepTrace::Start(device));
//   ... N steps ...
//   ASSIGN_OR_RETURN(TraceSummary s, trace->Stop());
//   out << TraceSummaryJson(s, first_step, N, N);

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

struct TraceBucket {
  std::string name;
  double time_s = 0;
  int64_t count = 0;
};

struct TraceSummary {
  // "device": the GPU's kernels, copies and sets; "host": the CPU's operators, by self time.
  std::string where;
  double total_s = 0;                   // of the categories
  std::vector<TraceBucket> categories;  // by time, the longest first
  std::vector<TraceBucket> top;         // the ten longest names
  TraceBucket copies;                   // host<->device and device copies
  int64_t syncs = 0;                    // host waits on the device (or item() on a CPU)
};

// The category of a kernel or operator's name: "gemm", "attention", "optimizer", "norm",
// "softmax_loss", "comm", "copy", "memset", "elementwise" or "other".
std::string KernelCategory(const std::string& name);

// One event as the summary sees it.
struct TraceEvent {
  std::string name;
  uint64_t start_ns = 0, duration_ns = 0;
  uint64_t thread = 0;  // host events: operators nest within a thread
  enum class Kind { kHostOp, kKernel, kCopy, kMemset, kRuntime } kind = Kind::kHostOp;
};
// Summarises `events`: device events when there are any (kernels, copies, sets; syncs from
// the runtime's calls), else host operators by self time (a parent's time less its children's).
TraceSummary Summarize(std::vector<TraceEvent> events);

// One JSON line: {"trace":{"first_step":..,"steps":..,"asked":..,"where":..,...}}: `steps`
// were traced of the `asked` (fewer when the run ended first).
std::string TraceSummaryJson(const TraceSummary& s, int64_t first_step, int64_t steps,
                             int64_t asked);

class StepTrace {
 public:
  // Starts the process's profiler (one at a time per process): CPU operators, and on a GPU its
  // kernels and the runtime's calls.
  static absl::StatusOr<std::unique_ptr<StepTrace>> Start(torch::Device device);
  ~StepTrace();
  // Stops it (waiting for the device first, unless not `wait`: after a failed step) and
  // summarises what it saw.
  absl::StatusOr<TraceSummary> Stop(bool wait = true);

 private:
  explicit StepTrace(torch::Device device) : device_(device) {}
  const torch::Device device_;
  bool running_ = false;
};

}  // namespace varuna

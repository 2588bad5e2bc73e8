#pragma once

// varuna-worker --timeline_out FILE [--trace_steps N]: one JSON line per step with the step
// split by device events (Note [Step timeline] in worker/engine/step_timeline.cc), and with
// --trace_steps a profiler summary of N steps (Note [Step trace] in step_trace.cc) as one more
// line. Process rank 0 writes FILE, every other process FILE.rank<R>. docs/gpu.md shows a file.
//
//   ASSIGN_OR_RETURN(auto out, TimelineOut::Open(path, rank, trace_steps, device));
//   options.timeline = out->timeline();
//   for each step: out->BeforeStep(step, first, last); ...step...; out->AfterStep(step, r, dt);
//   out->Finish();

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/step_timeline.h"
#include "worker/runtime/step_trace.h"

namespace varuna {

// {"step":..,"rank":..,"forward_s":..,"backward_s":..,"norm_s":..,"optimizer_s":..,
//  "comm_s":..,"host_syncs":..,"step_s":..,"clock":..,"traced":..}
std::string StepTimesJson(const StepTimes& t, int rank, bool traced);

class TimelineOut {
 public:
  // An unwritable file is InvalidArgument naming it.
  static absl::StatusOr<std::unique_ptr<TimelineOut>> Open(const std::string& path,
                                                           int process_rank, int64_t trace_steps,
                                                           torch::Device device);
  StepTimeline* timeline() { return &timeline_; }
  // The three calls below never fail the run: an error mid-run (the disk full, the profiler
  // refusing) is logged once as a warning and the timeline stops there, while training goes
  // on (what was written stays). They return OK for that reason.
  //
  // Before step `step` of a run whose steps are first..last: starts the trace on its first
  // step (the run's second, past the warm-up, when the run is long enough).
  absl::Status BeforeStep(int64_t step, int64_t first, int64_t last);
  // After step `step` succeeded: writes the steps whose events have completed, and the trace's
  // summary after its last step.
  absl::Status AfterStep(int64_t step, int host_syncs, double step_s);
  // A failed step: its spans are dropped, and Finish will not wait for the device (a broken
  // collective may never complete).
  void StepFailed() {
    timeline_.DiscardStep();
    failed_ = true;
  }
  // At the run's end (or before a regroup): writes every step left, waiting for the device
  // unless a step failed (steps not done then are dropped), and the trace's summary if it is
  // still running (fewer steps than asked: it says so).
  absl::Status Finish();

 private:
  TimelineOut(int rank, int64_t trace_steps, torch::Device device)
      : rank_(rank), trace_steps_(trace_steps), device_(device), timeline_(device) {}
  absl::Status TryBeforeStep(int64_t step, int64_t first, int64_t last);
  absl::Status TryAfterStep(int64_t step, int host_syncs, double step_s);
  absl::Status TryFinish();
  absl::Status Write(bool wait);
  absl::Status StopTrace(bool wait = true);
  // An error mid-run: warns once and turns the timeline off (off_). Returns OK.
  absl::Status Survive(const absl::Status& s);

  const int rank_;
  const int64_t trace_steps_;
  const torch::Device device_;
  StepTimeline timeline_;
  std::ofstream file_;
  std::string path_;
  std::unique_ptr<StepTrace> trace_;
  int64_t trace_first_ = 0, trace_done_ = 0;  // steps traced so far
  bool traced_ = false;                       // the trace has run
  bool failed_ = false;                       // a step failed since the last Finish
  bool off_ = false;                          // an error turned the timeline off
};

}  // namespace varuna

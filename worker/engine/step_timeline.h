#pragma once

// Where a step's time goes, measured by device events (Note [Step timeline] in
// step_timeline.cc): the engine marks its phases, the worker's --timeline_out writes one JSON
// line per step (worker/runtime/timeline_out.h).
//
//   StepTimeline timeline(device);
//   options.timeline = &timeline;                 // VarunaOptions: the engine marks its phases
//   ... step ...
//   timeline.EndStep(step, result.host_syncs, wall_s);
//   for (const StepTimes& t : timeline.TakeDone(/*wait=*/false)) Write(t);
//
// One thread: the engine's.

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace varuna {

enum class StepPhase { kForward, kBackward, kNorm, kOptimizer, kComm };
constexpr int kStepPhases = 5;
// "forward", "backward", "norm", "optimizer", "comm".
const char* StepPhaseName(StepPhase phase);

struct StepTimes {
  int64_t step = 0;
  // Seconds in each phase (StepPhase order); on a GPU the device's time between the phase's
  // events, summed over its spans.
  std::array<double, kStepPhases> seconds{};
  int host_syncs = 0;  // the engine's count (Note [Host syncs] in varuna.cc)
  double step_s = 0;   // the host's wall time of the whole step
  std::string clock;   // "device_events" or "host"
};

class StepTimeline {
 public:
  explicit StepTimeline(torch::Device device);
  ~StepTimeline();
  StepTimeline(const StepTimeline&) = delete;
  StepTimeline& operator=(const StepTimeline&) = delete;

  // The time from Begin to End (on the device's current stream) is added to `phase`. A Begin
  // of a phase already open is ignored, as is an End of one not open.
  void Begin(StepPhase phase);
  void End(StepPhase phase);
  // Begin now, End when it goes out of scope. `timeline` may be null (nothing timed).
  class Scope {
   public:
    Scope(StepTimeline* timeline, StepPhase phase) : timeline_(timeline), phase_(phase) {
      if (timeline_) timeline_->Begin(phase_);
    }
    ~Scope() {
      if (timeline_) timeline_->End(phase_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepTimeline* timeline_;
    StepPhase phase_;
  };

  // Closes the step's spans (any still open end here) under `step`.
  void EndStep(int64_t step, int host_syncs, double step_s);
  // Drops the open step's spans (a failed step).
  void DiscardStep();
  // Drops every ended step not yet taken.
  void DropEnded();
  // The ended steps whose events have all completed, oldest first. A device's events are read
  // without waiting (a step's are done once the next step has read back: Note [Step
  // timeline]); with `wait`, every ended step is returned, waiting for the device if need be.
  std::vector<StepTimes> TakeDone(bool wait);

  bool on_device() const { return device_events_; }

 private:
  struct Span;
  struct Step;

  const torch::Device device_;
  const bool device_events_;
  std::unique_ptr<Step> open_;
  std::deque<std::unique_ptr<Step>> ended_;
};

}  // namespace varuna

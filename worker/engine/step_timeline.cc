#include "worker/engine/step_timeline.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <optional>

namespace varuna {

// Note [Step timeline]: a step's split into forward, backward, norm, optimizer and (exposed)
// communication, for --timeline_out. On a GPU the host runs ahead of the device, so host
// clocks around a phase measure how fast kernels are queued, not how long they run: each span
// is a pair of device events recorded on the compute stream, and its time is the device's
// time between them. Reading an event's time before it has completed would wait for the
// device, one more host sync in a step that makes one (Note [Host syncs] in varuna.cc); so a
// step's spans wait here until their events have completed, which they have once the next
// step has read back (everything queued before a read is done when it returns), and the line
// is written a step late; the run's end waits for the last one. On the CPU, where an
// operation is done when it returns, a span is two host clock readings.
//   comm is what communication the compute stream waited for: the data-parallel buckets not
// hidden behind the backward, the tied weights' reduction and the step's agreement; a
// pipeline's waits for its neighbours are the metrics line's recv_wait_s.

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

const char* StepPhaseName(StepPhase phase) {
  switch (phase) {
    case StepPhase::kForward:
      return "forward";
    case StepPhase::kBackward:
      return "backward";
    case StepPhase::kNorm:
      return "norm";
    case StepPhase::kOptimizer:
      return "optimizer";
    case StepPhase::kComm:
      return "comm";
  }
  return "?";
}

struct StepTimeline::Span {
  StepPhase phase;
  std::optional<c10::Event> begin, end;  // device spans
  Clock::time_point host_begin;          // host spans
};

struct StepTimeline::Step {
  StepTimes times;
  std::vector<Span> spans;              // device spans, in the order they began
  std::array<int, kStepPhases> open{};  // index + 1 into spans (device) of each open phase
  std::array<Clock::time_point, kStepPhases> host_begin{};
  std::array<bool, kStepPhases> host_open{};
};

StepTimeline::StepTimeline(torch::Device device)
    : device_(device), device_events_(device.type() != torch::kCPU) {}

StepTimeline::~StepTimeline() = default;

void StepTimeline::Begin(StepPhase phase) {
  if (!open_) open_ = std::make_unique<Step>();
  const int p = static_cast<int>(phase);
  if (!device_events_) {
    if (open_->host_open[p]) return;
    open_->host_open[p] = true;
    open_->host_begin[p] = Clock::now();
    return;
  }
  if (open_->open[p] != 0) return;
  c10::impl::VirtualGuardImpl impl(device_.type());
  Span span{phase, c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT), std::nullopt, {}};
  span.begin->record(impl.getStream(device_));
  open_->spans.push_back(std::move(span));
  open_->open[p] = static_cast<int>(open_->spans.size());
}

void StepTimeline::End(StepPhase phase) {
  if (!open_) return;
  const int p = static_cast<int>(phase);
  if (!device_events_) {
    if (!open_->host_open[p]) return;
    open_->host_open[p] = false;
    open_->times.seconds[p] +=
        std::chrono::duration<double>(Clock::now() - open_->host_begin[p]).count();
    return;
  }
  if (open_->open[p] == 0) return;
  Span& span = open_->spans[open_->open[p] - 1];
  open_->open[p] = 0;
  c10::impl::VirtualGuardImpl impl(device_.type());
  span.end.emplace(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
  span.end->record(impl.getStream(device_));
}

void StepTimeline::EndStep(int64_t step, int host_syncs, double step_s) {
  if (!open_) open_ = std::make_unique<Step>();
  for (int p = 0; p < kStepPhases; ++p) End(static_cast<StepPhase>(p));
  open_->times.step = step;
  open_->times.host_syncs = host_syncs;
  open_->times.step_s = step_s;
  open_->times.clock = device_events_ ? "device_events" : "host";
  ended_.push_back(std::move(open_));
}

void StepTimeline::DiscardStep() { open_.reset(); }

void StepTimeline::DropEnded() { ended_.clear(); }

std::vector<StepTimes> StepTimeline::TakeDone(bool wait) {
  std::vector<StepTimes> done;
  while (!ended_.empty()) {
    Step& s = *ended_.front();
    bool complete = true;
    for (Span& span : s.spans) {
      if (span.end->query()) continue;
      if (!wait) {
        complete = false;
        break;
      }
      span.end->synchronize();
    }
    if (!complete) break;
    for (Span& span : s.spans) {
      s.times.seconds[static_cast<int>(span.phase)] += span.begin->elapsedTime(*span.end) / 1e3;
    }
    done.push_back(std::move(s.times));
    ended_.pop_front();
  }
  return done;
}

}  // namespace varuna

#include "worker/runtime/timeline_out.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"

namespace varuna {

std::string StepTimesJson(const StepTimes& t, int rank, bool traced) {
  std::string out = absl::StrFormat("{\"step\":%d,\"rank\":%d", t.step, rank);
  for (int p = 0; p < kStepPhases; ++p) {
    absl::StrAppendFormat(&out, ",\"%s_s\":%.6g", StepPhaseName(static_cast<StepPhase>(p)),
                          t.seconds[p]);
  }
  absl::StrAppendFormat(&out, ",\"host_syncs\":%d,\"step_s\":%.6g,\"clock\":\"%s\",\"traced\":%s}",
                        t.host_syncs, t.step_s, t.clock, traced ? "true" : "false");
  return out;
}

absl::StatusOr<std::unique_ptr<TimelineOut>> TimelineOut::Open(const std::string& path,
                                                               int process_rank,
                                                               int64_t trace_steps,
                                                               torch::Device device) {
  std::unique_ptr<TimelineOut> out(new TimelineOut(process_rank, trace_steps, device));
  out->path_ = process_rank == 0 ? path : absl::StrCat(path, ".rank", process_rank);
  out->file_.open(out->path_, std::ios::trunc);
  if (!out->file_) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeline_out '", out->path_, "' cannot be written"));
  }
  return out;
}

absl::Status TimelineOut::BeforeStep(int64_t step, int64_t first, int64_t last) {
  return off_ ? absl::OkStatus() : Survive(TryBeforeStep(step, first, last));
}

absl::Status TimelineOut::AfterStep(int64_t step, int host_syncs, double step_s) {
  if (!off_) return Survive(TryAfterStep(step, host_syncs, step_s));
  // Off: the engine still marks its steps; they are dropped as they end.
  timeline_.EndStep(step, host_syncs, step_s);
  timeline_.TakeDone(/*wait=*/false);
  return absl::OkStatus();
}

absl::Status TimelineOut::Finish() {
  if (off_) {
    timeline_.DropEnded();
    return absl::OkStatus();
  }
  return Survive(TryFinish());
}

absl::Status TimelineOut::Survive(const absl::Status& s) {
  if (s.ok()) return s;
  LOG(WARNING) << "the step timeline stops here (" << path_ << "): " << s.message()
               << "; training goes on";
  off_ = true;
  if (trace_) {
    absl::StatusOr<TraceSummary> ignored = trace_->Stop(/*wait=*/false);
    trace_.reset();
  }
  timeline_.DropEnded();
  return absl::OkStatus();
}

absl::Status TimelineOut::TryBeforeStep(int64_t step, int64_t first, int64_t last) {
  if (trace_steps_ <= 0 || traced_ || trace_) return absl::OkStatus();
  // Past the first step (allocations, autotuning) when the run has room for it.
  const int64_t start = last - first + 1 > trace_steps_ ? first + 1 : first;
  if (step < start) return absl::OkStatus();
  ASSIGN_OR_RETURN(trace_, StepTrace::Start(device_));
  trace_first_ = step;
  trace_done_ = 0;
  return absl::OkStatus();
}

absl::Status TimelineOut::TryAfterStep(int64_t step, int host_syncs, double step_s) {
  timeline_.EndStep(step, host_syncs, step_s);
  if (trace_) ++trace_done_;
  RETURN_IF_ERROR(Write(/*wait=*/false));
  if (trace_ && trace_done_ >= trace_steps_) RETURN_IF_ERROR(StopTrace());
  return absl::OkStatus();
}

absl::Status TimelineOut::TryFinish() {
  RETURN_IF_ERROR(Write(/*wait=*/!failed_));
  if (failed_) timeline_.DropEnded();
  if (trace_) RETURN_IF_ERROR(StopTrace(/*wait=*/!failed_));
  failed_ = false;
  return absl::OkStatus();
}

absl::Status TimelineOut::Write(bool wait) {
  for (const StepTimes& t : timeline_.TakeDone(wait)) {
    const bool traced =
        traced_ || trace_ ? t.step >= trace_first_ && t.step < trace_first_ + trace_done_ : false;
    file_ << StepTimesJson(t, rank_, traced) << "\n";
  }
  file_.flush();
  if (!file_) return absl::DataLossError(absl::StrCat("writing '", path_, "' failed"));
  return absl::OkStatus();
}

absl::Status TimelineOut::StopTrace(bool wait) {
  std::unique_ptr<StepTrace> trace = std::move(trace_);
  traced_ = true;
  ASSIGN_OR_RETURN(TraceSummary s, trace->Stop(wait));
  file_ << TraceSummaryJson(s, trace_first_, trace_done_, trace_steps_) << "\n";
  file_.flush();
  if (!file_) return absl::DataLossError(absl::StrCat("writing '", path_, "' failed"));
  return absl::OkStatus();
}

}  // namespace varuna

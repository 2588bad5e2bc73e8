#include "common/pipeline/schedule.h"

#include <algorithm>
#include <array>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace varuna {
namespace {

// The Varuna tick simulation (Note [Schedules]). Queue kinds in pop priority order; a backward
// occupies two ticks: kBackwardQueue (its first tick, emitted) then kBackwardContinueQueue (a
// placeholder that only occupies the second tick).
enum Queue {
  kBackwardContinueQueue = 0,
  kBackwardQueue,
  kRecomputeQueue,
  kForwardQueue,
  kNumQueues
};

std::vector<std::vector<Task>> VarunaSchedule(int stages, int micro_batches) {
  std::vector<std::array<std::deque<int>, kNumQueues>> queues(stages);
  for (int m = 0; m < micro_batches; ++m) queues[0][kForwardQueue].push_back(m);
  std::vector<std::vector<Task>> out(stages);
  struct Popped {
    int queue;
    int micro_batch;
  };
  // Each tick all stages pop simultaneously; the work they enqueue is visible from the next
  // tick on. A tick in which no stage has work ends the simulation.
  for (bool busy = true; busy;) {
    busy = false;
    std::vector<Popped> popped(stages, {kNumQueues, -1});
    for (int s = 0; s < stages; ++s) {
      for (int k = 0; k < kNumQueues; ++k) {
        if (queues[s][k].empty()) continue;
        popped[s] = {k, queues[s][k].front()};
        queues[s][k].pop_front();
        busy = true;
        break;
      }
    }
    for (int s = 0; s < stages; ++s) {
      const int m = popped[s].micro_batch;
      const bool last = s == stages - 1;
      switch (popped[s].queue) {
        case kForwardQueue:
          out[s].push_back({TaskKind::kForward, m, /*keep_graph=*/last});
          if (last) {
            queues[s][kBackwardQueue].push_back(m);
          } else {
            queues[s + 1][kForwardQueue].push_back(m);
          }
          break;
        case kRecomputeQueue:
          out[s].push_back({TaskKind::kRecompute, m});
          queues[s][kBackwardQueue].push_back(m);
          break;
        case kBackwardQueue:
          out[s].push_back({TaskKind::kBackward, m});
          queues[s][kBackwardContinueQueue].push_back(m);
          if (s > 0) queues[s - 1][kRecomputeQueue].push_back(m);
          break;
        default:  // kBackwardContinueQueue or idle: nothing to emit or enqueue.
          break;
      }
    }
  }
  return out;
}

std::vector<Task> OneFOneBSchedule(int stages, int micro_batches, int stage) {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<Task> out;
  for (int m = 0; m < warmup; ++m) out.push_back({TaskKind::kForward, m, true});
  for (int m = 0; m + warmup < micro_batches; ++m) {
    out.push_back({TaskKind::kForward, m + warmup, true});
    out.push_back({TaskKind::kBackward, m});
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m) {
    out.push_back({TaskKind::kBackward, m});
  }
  return out;
}

// ZB-H1 (Note [Schedules]).
std::vector<Task> ZbH1Schedule(int stages, int micro_batches, int stage) {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<Task> out;
  for (int m = 0; m < warmup; ++m) out.push_back({TaskKind::kForward, m, true});
  int next_w = 0;
  for (int b = 0; b < micro_batches; ++b) {
    if (b + warmup < micro_batches) out.push_back({TaskKind::kForward, b + warmup, true});
    out.push_back({TaskKind::kBackward, b});
    // W(m) waits until B(m + stage) has run.
    for (; next_w <= b - stage; ++next_w) out.push_back({TaskKind::kWeight, next_w});
  }
  for (; next_w < micro_batches; ++next_w) out.push_back({TaskKind::kWeight, next_w});
  return out;
}

std::vector<Task> GPipeSchedule(int micro_batches) {
  std::vector<Task> out;
  for (int m = 0; m < micro_batches; ++m) out.push_back({TaskKind::kForward, m, true});
  for (int m = 0; m < micro_batches; ++m) out.push_back({TaskKind::kBackward, m});
  return out;
}

}  // namespace

absl::StatusOr<SchedulePolicy> ParseSchedulePolicy(const std::string& name) {
  for (SchedulePolicy p : {SchedulePolicy::kVaruna, SchedulePolicy::kGPipe, SchedulePolicy::k1F1B,
                           SchedulePolicy::kZbH1}) {
    if (name == SchedulePolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule policy \"", name,
                                                 "\"; valid names are varuna, gpipe, 1f1b, zb-h1"));
}

std::string SchedulePolicyName(SchedulePolicy policy) {
  switch (policy) {
    case SchedulePolicy::kVaruna:
      return "varuna";
    case SchedulePolicy::kGPipe:
      return "gpipe";
    case SchedulePolicy::k1F1B:
      return "1f1b";
    case SchedulePolicy::kZbH1:
      return "zb-h1";
  }
  return "unknown";
}

std::vector<std::vector<Task>> MakeSchedules(SchedulePolicy policy, int stages, int micro_batches) {
  CHECK_GE(stages, 1) << "stages=" << stages;
  CHECK_GE(micro_batches, 1) << "micro_batches=" << micro_batches;
  std::vector<std::vector<Task>> out(stages);
  // With one stage every other policy degenerates to F0 B0 F1 B1 ... (1F1B with no warm-up).
  if (stages > 1 && policy == SchedulePolicy::kVaruna) return VarunaSchedule(stages, micro_batches);
  for (int s = 0; s < stages; ++s) {
    // ZB-H1 keeps its split even on one stage (F0 B0 W0 F1 ...): the engine runs one path.
    if (policy == SchedulePolicy::kZbH1) {
      out[s] = ZbH1Schedule(stages, micro_batches, s);
    } else {
      out[s] = stages > 1 && policy == SchedulePolicy::kGPipe
                   ? GPipeSchedule(micro_batches)
                   : OneFOneBSchedule(stages, micro_batches, s);
    }
  }
  return out;
}

std::vector<Task> MakeSchedule(SchedulePolicy policy, int stages, int micro_batches, int stage) {
  CHECK(stage >= 0 && stage < stages) << "stage=" << stage << " stages=" << stages;
  return MakeSchedules(policy, stages, micro_batches)[stage];
}

std::string FormatSchedule(const std::vector<Task>& tasks) {
  std::string out;
  for (const Task& t : tasks) {
    const char* kind = t.kind == TaskKind::kForward     ? "F"
                       : t.kind == TaskKind::kRecompute ? "R"
                       : t.kind == TaskKind::kWeight    ? "W"
                                                        : "B";
    absl::StrAppend(&out, out.empty() ? "" : " ", kind, t.micro_batch);
  }
  return out;
}

size_t RecomputeYieldsTo(const std::vector<Task>& tasks, size_t i, bool grad_ready,
                         bool next_input_ready, size_t next_forward) {
  if (tasks[i].kind != TaskKind::kRecompute || grad_ready || !next_input_ready) return i;
  size_t j = next_forward;
  if (j == SIZE_MAX) {
    for (j = i + 1; j < tasks.size() && tasks[j].kind != TaskKind::kForward;) ++j;
  }
  return j > i && j < tasks.size() ? j : i;
}

}  // namespace varuna

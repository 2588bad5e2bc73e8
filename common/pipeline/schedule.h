#pragma once

// Pipeline schedules as a pure function, shared by the engine and a simulator (no LibTorch).
//
// Note [Schedules]:
//  - kVaruna: a unit-time tick simulation of all P stages (forward = 1 tick, recompute = 1,
//    backward = 2). Each stage pops one task per tick by priority backward-continue > backward
//    > recompute > forward. F(m) on stage i<P-1 enqueues F(m) on i+1; F(m) on the last stage
//    enqueues B(m) on the same stage (the last stage never recomputes: its forwards keep the
//    autograd graph); the first tick of B(m) on stage i>0 enqueues R(m) on stage i-1, so the
//    recompute runs while stage i finishes the backward; R(m) done enqueues B(m) on the same
//    stage. Non-last stages run forwards without the graph and recompute before backward.
//  - kGPipe: all forwards (graph kept), then all backwards in micro-batch order.
//  - k1F1B: stage s runs min(P-s-1, M) warm-up forwards, then alternates F and B, then drains
//    the remaining backwards. Forwards keep the graph, nothing recomputes.
//  - kZbH1 (zero bubble, Qi et al. ICLR'24, "ZB-H1"): the backward is split into B (the input
//    gradient, sent upstream at once) and W (the weight gradients, which nothing waits for).
//    F and B run in 1F1B's order; stage s runs W(m) right after B(m + s) (the rest at the end).
//    So every stage holds at most min(P, M) micro-batches between F and W, 1F1B's peak (which
//    1F1B reaches on stage 0 only), and with F = B = W and M >= P each stage idles P - 1 units
//    where 1F1B idles 3(P - 1): the step takes 3M + P - 1 units (ScheduleTest, SimulatorTest).
// For P == 1 every policy is F0 B0 F1 B1 ... with the graph kept (F0 B0 W0 F1 ... for kZbH1).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

enum class SchedulePolicy { kVaruna, kGPipe, k1F1B, kZbH1 };

// Parses "varuna" | "gpipe" | "1f1b" | "zb-h1"; InvalidArgument naming the value otherwise.
absl::StatusOr<SchedulePolicy> ParseSchedulePolicy(const std::string& name);
std::string SchedulePolicyName(SchedulePolicy policy);

// kBackward is the whole backward, or only its input-gradient part (B) when the list also has
// kWeight tasks (kZbH1): then kWeight(m) adds micro-batch m's weight gradients.
enum class TaskKind { kForward, kRecompute, kBackward, kWeight };

struct Task {
  TaskKind kind;
  int micro_batch;  // 0-based
  // For kForward only: true if the forward keeps its autograd graph for a later backward
  // (no recompute follows); false if it runs without grad and stashes its input + RNG state.
  bool keep_graph = false;

  bool operator==(const Task& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && keep_graph == o.keep_graph;
  }
};

// Returns the ordered task list of `stage` (0-based) for `stages` stages and `micro_batches`
// micro-batches. Preconditions: stages >= 1, micro_batches >= 1, 0 <= stage < stages.
// Invariants every policy satisfies: each micro-batch appears as exactly one F and one B
// (and one R iff its F has keep_graph == false); forwards appear in micro-batch order;
// backwards appear in micro-batch order; R(m) precedes B(m) and follows F(m). With kZbH1 each
// micro-batch also has one W, after its B, and Ws appear in micro-batch order.
std::vector<Task> MakeSchedule(SchedulePolicy policy, int stages, int micro_batches, int stage);
// Every stage's list at once (index = stage); MakeSchedule() returns one element of it.
std::vector<std::vector<Task>> MakeSchedules(SchedulePolicy policy, int stages, int micro_batches);

// The engine's run-time rule (Note [Pipeline execution] in worker/engine/pipeline_executor.cc),
// shared with the simulator: when tasks[i] is a recompute, its gradient has not arrived
// (`grad_ready` false) and the input of the next forward has (`next_input_ready`; always true on
// stage 0), that forward runs now instead. Returns its index, or i when the recompute runs.
// `next_forward`, if known, is the index of the first forward after i (tasks.size() if none);
// otherwise it is searched for. The engine then moves task j to position i (std::rotate).
size_t RecomputeYieldsTo(const std::vector<Task>& tasks, size_t i, bool grad_ready,
                         bool next_input_ready, size_t next_forward = SIZE_MAX);

// Whether the policy's lists split the backward into B and W tasks.
inline bool SplitsBackward(SchedulePolicy policy) { return policy == SchedulePolicy::kZbH1; }

// Formats a task list like "F0 F1 R0 B0 W0 ..." (tests, logs).
std::string FormatSchedule(const std::vector<Task>& tasks);

}  // namespace varuna

#pragma once

// Step-time simulator (docs/autoconfig.md): a discrete-event simulation of one optimizer step
// of one pipeline that executes exactly the task lists of MakeSchedule() (the engine's own
// function) with the engine's run-time rule: a recompute whose gradient has not arrived yields
// to the next forward whose input has. Transfers go through one sender per link direction
// (as worker/dist/comm.cc does), so they overlap compute but not each other. After the pipeline:
// tied-weight all-reduce (first + last stage), the data-parallel all-reduce of each stage,
// the step's pipeline-wide agreement, the optimizer. No LibTorch.

#include <vector>

#include "common/pipeline/schedule.h"

namespace varuna {

// One stage's costs for one micro-batch (all micro-batches are the same size).
struct SimStage {
  double forward_s = 0;         // forward keeping the graph (last stage; gpipe; 1f1b)
  double forward_nograd_s = 0;  // forward that stashes (varuna, non-last stages)
  double recompute_s = 0;
  double backward_s = 0;
  // The weight-gradient part of backward_s: with a split schedule (zb-h1) B takes
  // backward_s - weight_s and W weight_s.
  double weight_s = 0;
  double send_act_s = 0;   // activation to the next stage (unused on the last)
  double send_grad_s = 0;  // gradient to the previous stage (unused on the first)
  double allreduce_s = 0;  // data-parallel gradient all-reduce (0 with one replica)
  double optimizer_s = 0;
  // Memory: resting bytes (parameters, gradients, optimizer state, buckets), bytes held per
  // stashed micro-batch, per micro-batch with a live graph (until its W with a split
  // schedule), and the transient extra during a backward.
  double static_bytes = 0;
  double stash_bytes = 0;
  double graph_bytes = 0;
  double transient_bytes = 0;
};

struct SimInput {
  SchedulePolicy policy = SchedulePolicy::kVaruna;
  int micro_batches = 1;
  std::vector<SimStage> stages;
  double tied_allreduce_s = 0;  // first + last stage (only when there are 2+ stages)
  double sync_s = 0;            // the pipeline-wide agreement (loss, norm, overflow, stop)
  double step_overhead_s = 0;   // per step on every stage, outside the pipeline
  // MakeSchedules(policy, stages, micro_batches) if the caller has it already (planner cache);
  // null: computed here.
  const std::vector<std::vector<Task>>* schedules = nullptr;
  bool record_order = false;  // fill SimResult::executed
};

struct SimResult {
  double step_s = 0;
  double pipeline_s = 0;           // makespan of the schedule (all stages)
  std::vector<double> busy_s;      // compute time per stage in the pipeline
  std::vector<double> peak_bytes;  // per stage
  double bubble = 0;               // 1 - mean(busy) / pipeline_s
  // Per stage: when its last task and send ended, after the tied all-reduce (before its
  // data-parallel all-reduce).
  std::vector<double> end_s;
  // The order in which each stage ran its tasks (after run-time reordering), with
  // SimInput::record_order.
  std::vector<std::vector<Task>> executed;
};

// Preconditions: stages non-empty, micro_batches >= 1, costs finite and >= 0.
SimResult SimulateStep(const SimInput& input);

}  // namespace varuna

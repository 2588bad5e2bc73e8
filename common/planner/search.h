#pragma once

// The planner's search internals, shared by its two searches: the uniform P x D search
// (autoconfig.cc) and the heterogeneous one (mix_search.cc). Not part of the planner's
// interface: only common/planner/ includes this.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/pipeline/schedule.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"
#include "common/planner/simulator.h"
#include "common/spec/job_spec.h"
#include "varuna/v1/plan.pb.h"

namespace varuna::search {

inline constexpr double kPruneFactor = 1.5;
// Larger steps are rejected rather than simulated (memory and time grow with P x M).
inline constexpr int64_t kMaxSimulatedMicroBatches = 8192;

// Segment costs at each micro-batch size, interpolated once.
class SegmentCache {
 public:
  explicit SegmentCache(const v1::Profile& profile) : profile_(profile) {}
  const std::vector<SegmentTimes>& At(int mb) {
    auto it = cache_.find(mb);
    if (it != cache_.end()) return it->second;
    std::vector<SegmentTimes>& v = cache_[mb];
    for (const auto& seg : profile_.segments()) v.push_back(CostAt(seg, mb));
    return v;
  }

 private:
  const v1::Profile& profile_;
  std::map<int, std::vector<SegmentTimes>> cache_;
};

// "1.25 GiB".
std::string GiB(double bytes);
// Optimizer state tensors per parameter: 1 for SGD (momentum), 2 for Adam.
double OptimizerStates(const std::string& optimizer);

// The costs of the stages cut by `bounds` (P+1) at one micro-batch size: compute, optimizer
// and memory; no links, no all-reduce. `data_parallel`: a gradient bucket is resident.
// *param_bytes gets each stage's parameter bytes.
std::vector<SimStage> StageCosts(const JobSpec& spec, const v1::Profile& profile,
                                 const std::vector<SegmentTimes>& seg_times,
                                 const std::vector<int>& bounds, bool data_parallel,
                                 std::vector<double>* param_bytes);

// One uniform shape (P stages cut by `bounds`, D replicas, micro-batch `mb`) simulated on
// the request's slots.
absl::StatusOr<v1::Plan> Simulate(const JobSpec& spec, const v1::Profile& profile,
                                  SegmentCache& cache, const std::vector<int>& bounds, int P, int D,
                                  int mb, SchedulePolicy policy, const PlanRequest& req);

// `count` identical pipelines cut by `bounds`, each running `microbatches` micro-batches.
struct PipelineGroup {
  std::vector<int> bounds;
  int count = 1;
  int64_t microbatches = 1;
  int stages() const { return static_cast<int>(bounds.size()) - 1; }
};

// What the pipelines of one heterogeneous plan share: micro-batch size, schedule, the task
// lists by (stages, micro-batches), and the simulated task count (for the budget).
struct MixContext {
  MixContext(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
             const PlanRequest& req, int mb, SchedulePolicy policy)
      : spec(spec), profile(profile), cache(cache), req(req), mb(mb), policy(policy) {}
  const JobSpec& spec;
  const v1::Profile& profile;
  SegmentCache& cache;
  const PlanRequest& req;
  const int mb;
  const SchedulePolicy policy;
  bool data_parallel = true;  // more than one pipeline: a gradient bucket is resident
  // Each rank's node (an index into req.slots_per_node and req.node_speed) when the ranks are
  // already placed; null: PackRanks, as the manager places a new plan.
  const std::vector<int>* placed = nullptr;
  int64_t tasks = 0;
  std::map<std::pair<int, int64_t>, std::vector<std::vector<Task>>> schedules;
};

// The pipelines of `groups` laid out in order on consecutive ranks, simulated as one step
// (Note [Heterogeneous step] in mix_search.cc), with the request's node speeds.
absl::StatusOr<v1::Plan> SimulateMix(MixContext& ctx, const std::vector<PipelineGroup>& groups);

// Note [Speed-aware plans] (speed_plan.cc): the speed of node `node` in the request (1 when
// unset), and whether any node's is not 1.
double NodeSpeed(const PlanRequest& req, int node);
bool HasSpeeds(const PlanRequest& req);
// Simulate()'s P x D shape with the request's node speeds: every replica its own pipeline.
absl::StatusOr<v1::Plan> SimulateWithSpeeds(const JobSpec& spec, const v1::Profile& profile,
                                            SegmentCache& cache, const std::vector<int>& bounds,
                                            int P, int D, int mb, SchedulePolicy policy,
                                            const PlanRequest& req);
// The same ranks with work moved off the slow ones: each pipeline's stages cut so that the
// busiest stage, its work divided by its node's speed, is smallest, and each pipeline a share
// of the step's micro-batches by how fast it runs. A heterogeneous plan (Plan.topology).
absl::StatusOr<v1::Plan> BalanceForSpeeds(const JobSpec& spec, const v1::Profile& profile,
                                          SegmentCache& cache, const std::vector<int>& bounds,
                                          int P, int D, int mb, SchedulePolicy policy,
                                          const PlanRequest& req);

// A shape listed with the reason it was not simulated or does not fit.
v1::Plan Rejected(int P, int D, int mb, const std::string& schedule, const std::string& why);

// The divisors of n in increasing order (n <= kMaxGlobalBatch).
std::vector<int> Divisors(int64_t n);

// spec.parallel.pipelines as given (TopologyFromSpec on the profile's modules), simulated with
// each allowed schedule (mix_search.cc). Errors: the pipelines do not fit the model or the
// batch.
absl::Status PlanFixedPipelines(const JobSpec& spec, const v1::Profile& profile,
                                SegmentCache& cache, const std::vector<SchedulePolicy>& policies,
                                int cap, const PlanRequest& req, v1::PlanSet* out);

// The heterogeneous mixes on exactly `cap` slots (mix_search.cc). Adds plans (and rejected
// ones) to *out, lowers *best; returns the tasks simulated. `t0`: when the plan began
// (request.budget_s counts from it).
int64_t PlanMixes(const JobSpec& spec, const v1::Profile& profile, SegmentCache& cache,
                  const std::vector<SchedulePolicy>& policies, int cap, const PlanRequest& req,
                  absl::Time t0, int64_t simulated_before, double* best, v1::PlanSet* out);

}  // namespace varuna::search

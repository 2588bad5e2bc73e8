#include "manager/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/launch_args.h"
#include "common/stage_map.h"

namespace varuna {

absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec, std::vector<FreeSlots> nodes) {
  std::sort(nodes.begin(), nodes.end(), [](const FreeSlots& a, const FreeSlots& b) {
    return a.free != b.free ? a.free > b.free : a.node < b.node;
  });
  int total = 0, most_on_one = 0;
  for (const auto& n : nodes) {
    total += std::max(0, n.free);
    most_on_one = std::max(most_on_one, n.free);
  }
  int cap = total;
  if (spec.resources.max_slots > 0) cap = std::min(cap, spec.resources.max_slots);
  auto short_of = [&](int need) {
    return absl::ResourceExhaustedError(
        absl::StrCat("needs ", need, " slots, ", total, " free on schedulable nodes"));
  };

  int P = spec.parallel.stages;
  if (P == 0) {
    P = std::max(1, std::min({most_on_one, spec.model.layers, cap}));
    while (P > 1 && cap % P != 0) --P;
  }
  if (P > cap) return short_of(std::max(P, spec.resources.min_slots));
  int D = spec.parallel.replicas;
  if (D == 0) {
    D = cap / P;
    const int64_t mb = spec.parallel.micro_batch;
    while (D > 1 && (spec.train.global_batch % D != 0 || spec.train.global_batch / D < mb)) --D;
  }
  const int world = P * D;
  if (D < 1 || world > cap || world < spec.resources.min_slots) {
    return short_of(std::max({world, P, spec.resources.min_slots}));
  }
  if (spec.train.global_batch % D != 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.global_batch=", spec.train.global_batch,
                                                   " is not divisible by parallel.replicas=", D));
  }

  JobPlan plan;
  plan.stages = P;
  plan.replicas = D;
  plan.per_replica_batch = spec.train.global_batch / D;
  auto micro_batch = MicroBatchFor(spec.parallel.micro_batch, plan.per_replica_batch, P);
  if (!micro_batch.ok()) return micro_batch.status();
  plan.micro_batch = *micro_batch;
  plan.stage_to_rank_map = StageMap::Make(P, D).ToString();
  int rank = 0;
  for (const auto& n : nodes) {
    for (int local = 0; local < n.free && rank < world; ++local, ++rank) {
      v1::RankPlacement p;
      p.set_rank(rank);
      p.set_node(n.node);
      p.set_local_rank(local);
      plan.ranks.push_back(p);
    }
  }
  return plan;
}

}  // namespace varuna

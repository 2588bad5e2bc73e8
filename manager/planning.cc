#include "manager/planning.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"

namespace varuna {

absl::StatusOr<JobPlan> PlanForJob(const Job& job, std::vector<FreeSlots> free,
                                   const ProfileStore& profiles) {
  if (job.info().profile_job()) {
    // A profile job measures links between every slot it gets: one stage per slot.
    JobSpec spec = job.spec;
    spec.parallel.stages = 1;
    spec.parallel.micro_batch = 1;
    spec.parallel.schedule = "varuna";
    spec.parallel.pipelines.clear();
    int total = 0;
    for (const auto& f : free) total += f.free;
    const int cap =
        spec.resources.max_slots > 0 ? std::min(total, spec.resources.max_slots) : total;
    spec.parallel.replicas = std::max(1, cap);
    spec.train.global_batch = spec.parallel.replicas;
    auto plan = ::varuna::PlanJob(spec, std::move(free));
    if (plan.ok()) plan->source = "profile job";
    return plan;
  }
  return PlanWithProfile(job.spec, std::move(free), profiles.Find(job.spec));
}

absl::StatusOr<v1::PlanJobResponse> PlanOnCluster(const v1::PlanJobRequest& req,
                                                  const NodeTable& nodes,
                                                  const ProfileStore& profiles) {
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec_yaml()));
  // Every alive, schedulable slot (busy or not): the shape the job would get on this cluster.
  v1::PlanJobResponse resp;
  PlanRequest pr;
  pr.all = req.all();
  pr.heterogeneous = true;
  for (const auto& [name, n] : nodes.all()) {
    if (!nodes.Schedulable(n) || n.rec.slots() <= 0) continue;
    pr.slots_per_node.push_back(n.rec.slots());
    resp.add_slots_per_node(n.rec.slots());
  }
  const v1::Profile* stored = profiles.Find(spec);
  absl::StatusOr<v1::Profile> builtin;
  const v1::Profile* profile = stored;
  if (profile == nullptr) {
    builtin = BuiltinProfile(spec);
    if (!builtin.ok()) return builtin.status();
    profile = &*builtin;
  }
  ASSIGN_OR_RETURN(v1::PlanSet set, PlanShapes(spec, *profile, pr));
  if (stored == nullptr) {
    set.add_notes(absl::StrCat("no stored profile of '", ModelKey(spec.model),
                               "': jobs of this model run under the placement rule until one "
                               "is stored (varunactl profile JOB.yaml)"));
  }
  *resp.mutable_plans() = std::move(set);
  return resp;
}

}  // namespace varuna

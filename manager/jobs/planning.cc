#include "manager/jobs/planning.h"

#include <algorithm>
#include <map>
#include <string>
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
    spec.parallel.tp_size = 1;  // measured unsplit (Note [Tensor-parallel plans])
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
  // Note [Straggler ladder] in straggler_controller.cc: the speeds it measured for this job,
  // planned with the profile it decided with.
  std::map<std::string, double> speeds;
  for (const auto& n : job.rec.stragglers().speeds()) speeds[n.node()] = n.speed();
  absl::StatusOr<v1::Profile> profile = ProfileForStragglers(job, profiles);
  // Sharing: the allocator's width caps the plan (a shrink is a morph planned under it).
  const int alloc = job.info().allocated_slots();
  if (alloc > 0 && (job.spec.resources.max_slots == 0 || alloc < job.spec.resources.max_slots)) {
    JobSpec capped = job.spec;
    capped.resources.max_slots = std::max(alloc, capped.resources.min_slots);
    return PlanWithProfile(capped, std::move(free), profile.ok() ? &*profile : nullptr, speeds);
  }
  return PlanWithProfile(job.spec, std::move(free), profile.ok() ? &*profile : nullptr, speeds);
}

absl::StatusOr<v1::Profile> ProfileForStragglers(const Job& job, const ProfileStore& profiles) {
  if (const v1::Profile* stored = profiles.Find(job.spec)) return *stored;
  const auto& s = job.rec.stragglers();
  if (s.speeds().empty() && s.evicted().empty()) {
    return absl::NotFoundError("no stored profile (the placement rule plans)");
  }
  return BuiltinProfile(job.spec);
}

PlanInputs PlanInputsFor(const JobSpec& spec, const NodeTable& nodes,
                         const ProfileStore& profiles) {
  // Every alive, schedulable slot (busy or not): the shape the job would get on this cluster.
  PlanInputs in;
  for (const auto& [name, n] : nodes.all()) {
    if (!nodes.Schedulable(n) || n.rec.slots() <= 0) continue;
    in.slots_per_node.push_back(n.rec.slots());
  }
  if (const v1::Profile* stored = profiles.Find(spec)) in.stored = *stored;
  return in;
}

absl::StatusOr<v1::PlanJobResponse> PlanOnCluster(const v1::PlanJobRequest& req,
                                                  const JobSpec& spec, const PlanInputs& in) {
  v1::PlanJobResponse resp;
  PlanRequest pr;
  pr.all = req.all();
  pr.heterogeneous = true;
  pr.slots_per_node = in.slots_per_node;
  for (int s : in.slots_per_node) resp.add_slots_per_node(s);
  absl::StatusOr<v1::Profile> builtin;
  const v1::Profile* profile = in.stored ? &*in.stored : nullptr;
  if (profile == nullptr) {
    builtin = BuiltinProfile(spec);
    if (!builtin.ok()) return builtin.status();
    profile = &*builtin;
  }
  ASSIGN_OR_RETURN(v1::PlanSet set, PlanShapes(spec, *profile, pr));
  if (!in.stored) {
    set.add_notes(absl::StrCat("no stored profile of '", ModelKey(spec.model),
                               "': jobs of this model run under the placement rule until one "
                               "is stored (varunactl profile JOB.yaml)"));
  }
  *resp.mutable_plans() = std::move(set);
  return resp;
}

}  // namespace varuna

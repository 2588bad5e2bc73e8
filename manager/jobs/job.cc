#include "manager/jobs/job.h"

#include <signal.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net/rpc.h"

namespace varuna {

std::string JobWho(const v1::JobInfo& info) {
  return absl::StrCat("job=", info.id(), " gen=", info.generation());
}

std::string HostOf(const std::string& address) {
  auto hp = SplitHostPort(address);
  return hp.ok() ? hp->first : address;
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGKILL:
      return "SIGKILL";
    case SIGTERM:
      return "SIGTERM";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGINT:
      return "SIGINT";
    case SIGBUS:
      return "SIGBUS";
    default:
      return absl::StrCat("signal ", sig);
  }
}

std::string TimeText(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

bool Active(v1::JobState s) {
  return s == v1::STARTING || s == v1::RUNNING || s == v1::RECONFIGURING || s == v1::CANCELLING;
}

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

bool Reserving(const Job& job) {
  const auto phase = job.rec.morph().phase();
  return job.info().state() == v1::RECONFIGURING &&
         (phase == v1::MorphState::SAVING || phase == v1::MorphState::STOPPING ||
          phase == v1::MorphState::PLANNING);
}

bool PlacedOn(const Job& job, const std::string& node, int rank) {
  for (const auto& p : job.info().placement()) {
    if (p.rank() == rank) return p.node() == node;
  }
  return false;
}

std::string RanksOn(const Job& job, const std::string& node) {
  std::vector<int> ranks;
  for (const auto& p : job.info().placement()) {
    if (p.node() == node) ranks.push_back(p.rank());
  }
  return absl::StrCat("rank", ranks.size() > 1 ? "s " : " ", absl::StrJoin(ranks, ","));
}

std::string UnreportedReason(const std::pair<std::string, int>& node_rank) {
  return absl::StrCat("rank ", node_rank.second, " on node ", node_rank.first,
                      " is no longer known to its agent (agent restarted?)");
}

void NewGeneration(Job& job, absl::Time now) {
  job.gen = Generation();
  job.gen.starting_since = now;
  job.rec.clear_exits();
}

int TpOf(const v1::JobInfo& info) { return std::max(1, info.tp_size()); }

std::map<int, std::string> PositionNodes(const v1::JobInfo& info) {
  const int tp = TpOf(info);
  std::map<int, std::string> out;
  for (const auto& p : info.placement()) {
    if (p.rank() % tp == 0) out[p.rank() / tp] = p.node();
  }
  return out;
}

void ApplyPlan(v1::JobInfo& info, const JobPlan& plan, const std::string& first_node_address) {
  info.set_stages(plan.stages);
  info.set_replicas(plan.replicas);
  info.set_micro_batch(plan.micro_batch);
  info.set_stage_to_rank_map(plan.stage_to_rank_map);
  info.set_schedule(plan.schedule);
  info.clear_boundaries();
  for (int b : plan.boundaries) info.add_boundaries(b);
  info.set_predicted_step_s(plan.predicted_step_s);
  info.set_plan_source(plan.source);
  info.set_pipelines(plan.pipelines);
  info.set_tp_size(plan.tp_size > 1 ? plan.tp_size : 0);
  info.set_slots(static_cast<int>(plan.ranks.size()));
  info.clear_placement();
  for (const auto& p : plan.ranks) *info.add_placement() = p;
  info.set_master(absl::StrCat(HostOf(first_node_address), ":0"));
}

std::vector<const v1::MorphRecord*> RecentMorphs(const Job& job, absl::Time now,
                                                 absl::Duration window) {
  std::vector<const v1::MorphRecord*> out;
  for (const auto& r : job.info().morphs()) {
    absl::Time at;
    std::string err;
    // The allocator's resizes and evictions are the cluster's doing, not the job's trouble.
    if (r.kind() == "resize" || r.kind() == "evict") continue;
    if (absl::ParseTime("%Y-%m-%dT%H:%M:%SZ", r.at(), &at, &err) && now - at <= window) {
      out.push_back(&r);
    }
  }
  return out;
}

}  // namespace varuna

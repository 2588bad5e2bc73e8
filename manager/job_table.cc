#include "manager/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace varuna {

absl::Status JobTable::Load(absl::Time now) {
  ASSIGN_OR_RETURN(std::vector<v1::JobRecord> jobs, store_->LoadJobs());
  for (auto& rec : jobs) {
    Job job;
    auto spec = ParseJobSpec(rec.spec_yaml());
    if (!spec.ok()) {
      return absl::DataLossError(
          absl::StrCat("state database: job ", rec.info().id(),
                       " has an unreadable spec: ", spec.status().message()));
    }
    job.spec = *std::move(spec);
    job.rec = std::move(rec);
    job.gen.starting_since = now;
    job.gen.running_since = now;
    job.last_trigger = now;
    job.cause_priority = 3;
    job.cancelling_since = now;
    next_seq_ = std::max(next_seq_, job.rec.seq() + 1);
    const std::string id = job.info().id();
    if (!job.rec.request_id().empty()) by_request_[job.rec.request_id()] = id;
    order_.push_back(id);
    jobs_[id] = std::move(job);
  }
  return absl::OkStatus();
}

Job& JobTable::Add(Job job) {
  job.rec.set_seq(next_seq_++);
  job.info().set_id(absl::StrCat(job.rec.seq()));
  const std::string id = job.info().id();
  Persist(job);
  if (!job.rec.request_id().empty()) by_request_[job.rec.request_id()] = id;
  order_.push_back(id);
  return jobs_[id] = std::move(job);
}

Job* JobTable::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const Job* JobTable::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<Job*> JobTable::Get(const std::string& id) {
  Job* job = Find(id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job with id '", id, "'"));
  return job;
}

Job* JobTable::ByRequest(const std::string& request_id) {
  auto it = by_request_.find(request_id);
  return it == by_request_.end() ? nullptr : Find(it->second);
}

void JobTable::Persist(Job& job) {
  absl::Status s = store_->SaveJob(job.rec);
  CHECK(s.ok()) << "cannot persist job " << job.info().id() << ": " << s.message();
  job.progress_dirty = false;
}

std::map<std::string, int> JobTable::UsedSlots() const {
  std::map<std::string, int> used;
  for (const auto& [id, job] : jobs_) {
    if (!Active(job.info().state())) continue;
    // A job between generations keeps its slots: queued jobs must not take what it frees
    // while it saves and re-plans.
    const bool reserving = Reserving(job);
    std::set<int> exited;
    for (const auto& e : job.rec.exits()) exited.insert(e.rank());
    for (const auto& p : job.info().placement()) {
      if (reserving || !exited.count(p.rank())) ++used[p.node()];
    }
  }
  for (const auto& [name, n] : nodes_->all()) used[name] += n.other_running;
  return used;
}

std::vector<FreeSlots> JobTable::FreeSlotsFor(const Job* job,
                                              const std::set<std::string>& exclude) const {
  std::map<std::string, int> used = UsedSlots();
  if (job != nullptr) {
    // The job's own live ranks would be replaced by the new generation.
    const bool reserving = Reserving(*job);
    std::set<int> exited;
    for (const auto& e : job->rec.exits()) exited.insert(e.rank());
    for (const auto& p : job->info().placement()) {
      if ((reserving || !exited.count(p.rank())) && Active(job->info().state())) {
        --used[p.node()];
      }
    }
  }
  std::vector<FreeSlots> free;
  for (const auto& [name, n] : nodes_->all()) {
    if (!nodes_->Schedulable(n) || exclude.count(name)) continue;
    const int f = n.rec.slots() - std::max(0, used[name]);
    if (f > 0) free.push_back({name, f});
  }
  return free;
}

}  // namespace varuna

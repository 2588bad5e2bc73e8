#include "manager/jobs/job_table.h"

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
    std::string yaml;
    if (!rec.spec_yaml().empty()) {  // a state directory older than Note [Retention]; move it
      yaml = rec.spec_yaml();
      RETURN_IF_ERROR(store_->SaveSpec(rec.info().id(), yaml));
      rec.clear_spec_yaml();
      RETURN_IF_ERROR(store_->SaveJob(rec));
    } else {
      ASSIGN_OR_RETURN(yaml, store_->LoadSpec(rec.info().id()));
    }
    auto spec = ParseJobSpec(yaml);
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

// Note [Retention]: what a manager keeps grows with what users submit, so each part is
// bounded: a job's spec text (up to 1 MiB) is written once to the store's specs table and read
// back only to launch workers, never held in memory or rewritten with every record update;
// pending jobs are capped per submitter (JobController::Submit); finished jobs beyond
// max_finished_jobs, or finished longer than finished_job_ttl_s ago, are pruned with their
// records, specs and step series (Prune, from the manager's tick).
Job& JobTable::Add(Job job) {
  job.rec.set_seq(next_seq_++);
  job.info().set_id(absl::StrCat(job.rec.seq()));
  const std::string id = job.info().id();
  const absl::Status saved = store_->SaveSpec(id, job.rec.spec_yaml());
  CHECK(saved.ok()) << "manager: cannot write job " << id << "'s spec: " << saved.message();
  job.rec.clear_spec_yaml();
  Persist(job);
  if (!job.rec.request_id().empty()) by_request_[job.rec.request_id()] = id;
  order_.push_back(id);
  return jobs_[id] = std::move(job);
}

std::string JobTable::SpecYaml(const std::string& id) const {
  auto yaml = store_->LoadSpec(id);
  CHECK(yaml.ok()) << "manager: cannot read job " << id << "'s spec: " << yaml.status().message();
  return *std::move(yaml);
}

std::vector<std::string> JobTable::Prune(absl::Time now, int max_finished, absl::Duration ttl) {
  std::vector<std::string> finished;  // oldest first
  for (const std::string& id : order_) {
    if (Terminal(jobs_.at(id).info().state())) finished.push_back(id);
  }
  std::vector<std::string> pruned;
  const size_t over = finished.size() > static_cast<size_t>(std::max(0, max_finished))
                          ? finished.size() - static_cast<size_t>(std::max(0, max_finished))
                          : 0;
  for (size_t i = 0; i < finished.size(); ++i) {
    const v1::JobInfo& info = jobs_.at(finished[i]).info();
    absl::Time at;
    std::string err;
    const bool expired = ttl > absl::ZeroDuration() &&
                         absl::ParseTime(absl::RFC3339_full, info.finished_at(), &at, &err) &&
                         now - at > ttl;
    if (i < over || expired) pruned.push_back(finished[i]);
  }
  for (const std::string& id : pruned) {
    const absl::Status s = store_->DeleteJob(id);
    CHECK(s.ok()) << "manager: cannot delete job " << id << ": " << s.message();
    const Job& job = jobs_.at(id);
    if (!job.rec.request_id().empty()) by_request_.erase(job.rec.request_id());
    jobs_.erase(id);
    order_.erase(std::find(order_.begin(), order_.end(), id));
  }
  return pruned;
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
  std::set<std::string> evicted;  // Note [Straggler ladder] in straggler_controller.cc
  if (job != nullptr) {
    for (const auto& e : job->rec.stragglers().evicted()) evicted.insert(e.node());
  }
  std::vector<FreeSlots> free;
  for (const auto& [name, n] : nodes_->all()) {
    if (!nodes_->Schedulable(n) || exclude.count(name) || evicted.count(name)) continue;
    const int f = n.rec.slots() - std::max(0, used[name]);
    if (f > 0) free.push_back({name, f});
  }
  return free;
}

}  // namespace varuna

#include "manager/jobs/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace varuna {

namespace {

// What a loaded job record must be (Note [Records on load]); the first problem, or OK.
absl::Status CheckJobRecord(const v1::JobRecord& rec) {
  const v1::JobInfo& info = rec.info();
  if (!rec.quarantined().empty()) return absl::DataLossError(rec.quarantined());
  int64_t id = 0;
  if (!absl::SimpleAtoi(info.id(), &id) || id < 1 || info.id() != absl::StrCat(rec.seq())) {
    return absl::DataLossError(absl::StrCat("its id '", info.id().substr(0, 40),
                                            "' is not its sequence number ", rec.seq()));
  }
  if (!v1::JobState_IsValid(info.state()) || info.state() == v1::JOB_STATE_UNSPECIFIED) {
    return absl::DataLossError(absl::StrCat("its state ", info.state(), " is not a job state"));
  }
  if (info.generation() < 0 || info.step() < 0 || info.total_steps() < 0 ||
      info.placement_size() > 1 << 20 || info.name().size() > 1024 ||
      info.submitted_by().size() > 256) {
    return absl::DataLossError("a count or a name is out of bounds");
  }
  return absl::OkStatus();
}

// Request ids are the submitter's own: the key pairs the token's name with the id, so one
// tenant's id neither finds nor blocks another tenant's job.
std::pair<std::string, std::string> RequestKey(const Job& job) {
  return {job.info().submitted_by(), job.rec.request_id()};
}

}  // namespace

// Note [Records on load]: the store is outside data to a manager that loads it (an etcd any
// manager of the group writes, a database restored from a backup), and one bad record must not
// stop every manager from leading (a restart loop) nor load unchecked (a job hidden from list
// under an id that is no integer, a node of 2^31-1 slots). So each job record is checked
// (CheckJobRecord; its spec must parse) and a bad one is quarantined: the job loads FAILED with
// the record's key and the problem as its reason, its workers are stopped like any failed
// job's, and the rest of the cluster loads. A record that does not parse at all comes from the
// store as a stub naming its key (QuarantineCorrupt in manager/state/state_store.h). Node
// records are checked like a registration (PeerLimits::CheckRequest); a bad one is dropped,
// and its agent registers again.
absl::Status JobTable::Load(absl::Time now) {
  ASSIGN_OR_RETURN(std::vector<v1::JobRecord> jobs, store_->LoadJobs());
  for (auto& rec : jobs) {
    Job job;
    std::string yaml;
    absl::Status bad = CheckJobRecord(rec);
    if (bad.ok() && !rec.spec_yaml().empty()) {  // older than Note [Retention]; move it
      yaml = rec.spec_yaml();
      RETURN_IF_ERROR(store_->SaveSpec(rec.info().id(), yaml));
      rec.clear_spec_yaml();
      RETURN_IF_ERROR(store_->SaveJob(rec));
    } else if (bad.ok()) {
      absl::StatusOr<std::string> loaded = store_->LoadSpec(rec.info().id());
      if (loaded.ok()) {
        yaml = *std::move(loaded);
      } else {
        bad = loaded.status();
      }
    }
    absl::StatusOr<JobSpec> spec = bad.ok() ? ParseJobSpec(yaml) : absl::StatusOr<JobSpec>(bad);
    if (bad.ok() && !spec.ok()) {
      bad = absl::DataLossError(absl::StrCat("its spec does not parse: ", spec.status().message()));
    }
    if (!bad.ok()) {
      Quarantine(&rec, bad);
    } else {
      job.spec = *std::move(spec);
    }
    job.rec = std::move(rec);
    job.gen.starting_since = now;
    job.gen.running_since = now;
    job.last_trigger = now;
    job.cause_priority = 3;
    job.cancelling_since = now;
    next_seq_ = std::max(next_seq_, job.rec.seq() + 1);
    const std::string id = job.info().id();
    if (id.empty() || jobs_.count(id)) continue;  // a stub without a key, or a duplicate
    if (!job.rec.request_id().empty()) by_request_[RequestKey(job)] = id;
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
void JobTable::Quarantine(v1::JobRecord* rec, const absl::Status& why) {
  v1::JobInfo& info = *rec->mutable_info();
  const std::string key = info.id();
  // Ids are sequence numbers: a record under another key moves to its number.
  if (info.id() != absl::StrCat(rec->seq())) {
    if (!key.empty()) store_->DeleteJob(key).IgnoreError();
    info.set_id(absl::StrCat(rec->seq()));
  }
  const std::string reason = absl::StrCat("quarantined when the manager loaded it: job record '",
                                          key.substr(0, 64), "': ", why.message());
  LOG(ERROR) << "job=" << info.id() << " " << reason;
  info.set_state(v1::FAILED);
  info.set_reason(reason.substr(0, 1000));
  info.clear_placement();
  rec->clear_quarantined();
  rec->clear_morph();
  rec->clear_spec_yaml();
  absl::Status s = store_->SaveJob(*rec);
  if (!s.ok()) LOG(ERROR) << "job=" << info.id() << " quarantine not saved: " << s.message();
}

// Note [Job ids]: a job's id is an integer that names it everywhere: in varunactl, in the
// state, and in each agent's work_dir/jobs/ID (its logs, its specs). It is the next sequence
// number, but never below the seconds since 2025-01-01 at submission. A manager whose state
// was lost (a new state_dir) or restored from a backup therefore does not hand out an id again:
// the old ids lie behind the clock, so a new job never appends to an older job's log on an
// agent or shows its step records. (Only a burst of more than one submission a second on
// average since the backup could run ids ahead of the clock; admission caps each user's
// pending jobs.) The ids of one manager still grow by one when jobs come faster than that.
Job& JobTable::Add(Job job, absl::Time now) {
  next_seq_ = std::max<int64_t>(
      next_seq_, absl::ToInt64Seconds(now - absl::FromCivil(absl::CivilSecond(2025, 1, 1, 0, 0, 0),
                                                            absl::UTCTimeZone())));
  job.rec.set_seq(next_seq_++);
  job.info().set_id(absl::StrCat(job.rec.seq()));
  const std::string id = job.info().id();
  const absl::Status saved = store_->SaveSpec(id, job.rec.spec_yaml());
  CHECK(saved.ok()) << "manager: cannot write job " << id << "'s spec: " << saved.message();
  job.rec.clear_spec_yaml();
  Persist(job);
  if (!job.rec.request_id().empty()) by_request_[RequestKey(job)] = id;
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
    if (!job.rec.request_id().empty()) by_request_.erase(RequestKey(job));
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

Job* JobTable::ByRequest(const std::string& user, const std::string& request_id) {
  auto it = by_request_.find({user, request_id});
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

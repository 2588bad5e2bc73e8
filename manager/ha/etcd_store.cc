#include "manager/ha/etcd_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace varuna {
namespace {

constexpr int kEventsKept = 2000;
// Each transaction stays well under etcd's default 1.5 MiB request limit
// (--max-request-bytes), and a page of reads under gRPC's 4 MiB.
constexpr size_t kMaxChunkBytes = 256 << 10;

etcdserverpb::RequestOp PutOp(const std::string& key, const std::string& value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(value);
  return op;
}

etcdserverpb::RequestOp DeleteOp(const std::string& key, bool prefix = false) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  if (prefix) op.mutable_request_delete_range()->set_range_end(PrefixEnd(key));
  return op;
}

// Records under `prefix`, parsed; a corrupt one is QuarantineCorrupt's.
template <typename T>
std::vector<T> ParseRecords(const std::vector<EtcdKv>& kvs, const std::string& prefix) {
  std::vector<T> out;
  for (const EtcdKv& kv : kvs) {
    T rec;
    const std::string id = kv.key.substr(std::min(prefix.size(), kv.key.size()));
    if (rec.ParseFromString(kv.value) ||
        QuarantineCorrupt(absl::StrCat("etcd ", kv.key), id, kv.value.size(), &rec)) {
      out.push_back(std::move(rec));
    }
  }
  return out;
}

template <typename T>
absl::StatusOr<std::vector<T>> ParseAll(const std::vector<EtcdKv>& kvs, const std::string& what) {
  std::vector<T> out;
  for (const EtcdKv& kv : kvs) {
    T rec;
    if (!rec.ParseFromString(kv.value)) {  // one bad record must not stop every manager
      LOG(ERROR) << "etcd: a corrupt " << what << " at " << kv.key << "; skipped";
      continue;
    }
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdStateStore>> EtcdStateStore::Open(EtcdClient* etcd,
                                                                     const std::string& prefix,
                                                                     const std::string& local_dir,
                                                                     absl::Duration flush_period) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteStateStore> local, SqliteStateStore::Open(local_dir));
  return std::unique_ptr<EtcdStateStore>(
      new EtcdStateStore(etcd, prefix, std::move(local), flush_period));
}

absl::Status EtcdStateStore::TakeOver(int64_t term,
                                      std::function<void(const std::string&)> on_deposed) {
  std::vector<v1::Event> events;
  // One key per event (Note [High-rate state] in etcd_store.h); the one list of events an
  // older manager kept is read too.
  ASSIGN_OR_RETURN(std::vector<EtcdKv> ev, etcd_->Get(prefix_ + "events"));
  v1::ListEventsResponse list;
  if (!ev.empty() && list.ParseFromString(ev[0].value)) {
    events.assign(list.events().begin(), list.events().end());
  }
  ASSIGN_OR_RETURN(std::vector<EtcdKv> each, etcd_->GetPrefix(prefix_ + "events/"));
  for (const EtcdKv& kv : each) {
    v1::Event e;
    if (!e.ParseFromString(kv.value)) {  // not fatal (Note [Records on load] in job_table.cc)
      LOG(ERROR) << "etcd: a corrupt event at " << kv.key << "; skipped";
      continue;
    }
    events.push_back(std::move(e));
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const v1::Event& a, const v1::Event& b) { return a.seq() < b.seq(); });
  events.erase(
      std::unique(events.begin(), events.end(),
                  [](const v1::Event& a, const v1::Event& b) { return a.seq() == b.seq(); }),
      events.end());
  if (events.size() > static_cast<size_t>(kEventsKept)) {
    events.erase(events.begin(), events.end() - kEventsKept);
  }
  newest_event_seq_ = events.empty() ? 0 : events.back().seq();
  std::map<std::string, std::vector<v1::StepRecord>> steps;
  ASSIGN_OR_RETURN(std::vector<EtcdKv> chunks, etcd_->GetPrefix(prefix_ + "steps/"));
  for (const EtcdKv& kv : chunks) {
    const std::string rest = kv.key.substr(prefix_.size() + 6);  // JOB/N
    v1::GetMetricsResponse chunk;
    if (!chunk.ParseFromString(kv.value)) {  // not fatal (Note [Records on load] in job_table.cc)
      LOG(ERROR) << "etcd: a corrupt chunk of step records at " << kv.key << "; skipped";
      continue;
    }
    auto& v = steps[rest.substr(0, rest.rfind('/'))];
    v.insert(v.end(), chunk.steps().begin(), chunk.steps().end());
  }
  for (auto& [job, v] : steps) {  // chunks of two flushes can repeat a step (Flush)
    std::stable_sort(v.begin(), v.end(), [](const v1::StepRecord& a, const v1::StepRecord& b) {
      return a.step() < b.step();
    });
    v.erase(std::unique(v.begin(), v.end(),
                        [](const v1::StepRecord& a, const v1::StepRecord& b) {
                          return a.step() == b.step();
                        }),
            v.end());
  }
  RETURN_IF_ERROR(local_->ReplaceEventsAndSteps(events, steps));
  durable_step_.clear();
  oldest_unflushed_.clear();
  for (const auto& [job, v] : steps) {
    if (!v.empty()) durable_step_[job] = v.back().step();
  }
  term_ = term;
  on_deposed_ = std::move(on_deposed);
  return absl::OkStatus();
}

absl::Status EtcdStateStore::Guarded(std::vector<etcdserverpb::RequestOp> ops) {
  if (term_ == 0) return absl::FailedPreconditionError("etcd store: not the leader");
  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_key(prefix_ + "leader");
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_create_revision(term_);
  for (auto& op : ops) *txn.add_success() = std::move(op);
  absl::StatusOr<etcdserverpb::TxnResponse> r = etcd_->Txn(txn);
  if (!r.ok()) {
    // A leader that cannot write cannot act: what it acknowledged next would be lost.
    const std::string why = absl::StrCat("it cannot write to etcd: ", r.status().message());
    if (on_deposed_) on_deposed_(why);
    return r.status();
  }
  if (r->succeeded()) return absl::OkStatus();
  const std::string why =
      absl::StrCat("another manager leads (", prefix_, "leader no longer has term ", term_, ")");
  if (on_deposed_) on_deposed_(why);
  return absl::FailedPreconditionError(absl::StrCat("etcd store: ", why));
}

absl::Status EtcdStateStore::SaveJob(const v1::JobRecord& job) {
  return Guarded({PutOp(prefix_ + "jobs/" + job.info().id(), job.SerializeAsString())});
}

absl::Status EtcdStateStore::SaveNode(const v1::NodeRecord& node) {
  return Guarded({PutOp(prefix_ + "nodes/" + node.name(), node.SerializeAsString())});
}

absl::Status EtcdStateStore::DeleteNode(const std::string& name) {
  return Guarded({DeleteOp(prefix_ + "nodes/" + name)});
}

absl::Status EtcdStateStore::SaveSpec(const std::string& job_id, const std::string& yaml) {
  return Guarded({PutOp(prefix_ + "specs/" + job_id, yaml)});
}

absl::StatusOr<std::string> EtcdStateStore::LoadSpec(const std::string& job_id) {
  absl::StatusOr<std::vector<EtcdKv>> got = etcd_->Get(prefix_ + "specs/" + job_id);
  if (!got.ok()) {
    // As for a write: a leader that cannot read its state cannot act on it.
    if (on_deposed_) on_deposed_(absl::StrCat("it cannot read etcd: ", got.status().message()));
    return got.status();
  }
  const std::vector<EtcdKv>& kvs = *got;
  if (kvs.empty()) return absl::NotFoundError(absl::StrCat("etcd: no spec of job ", job_id));
  return kvs[0].value;
}

absl::Status EtcdStateStore::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(
      Guarded({DeleteOp(prefix_ + "jobs/" + job_id), DeleteOp(prefix_ + "specs/" + job_id),
               DeleteOp(prefix_ + "steps/" + job_id + "/", /*prefix=*/true)}));
  steps_dirty_.erase(job_id);
  return local_->DeleteJob(job_id);
}

absl::StatusOr<std::vector<v1::JobRecord>> EtcdStateStore::LoadJobs() {
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->GetPrefix(prefix_ + "jobs/"));
  std::vector<v1::JobRecord> jobs = ParseRecords<v1::JobRecord>(kvs, prefix_ + "jobs/");
  std::sort(jobs.begin(), jobs.end(),
            [](const v1::JobRecord& a, const v1::JobRecord& b) { return a.seq() < b.seq(); });
  return jobs;
}

absl::StatusOr<std::vector<v1::NodeRecord>> EtcdStateStore::LoadNodes() {
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->GetPrefix(prefix_ + "nodes/"));
  return ParseRecords<v1::NodeRecord>(kvs, prefix_ + "nodes/");
}

absl::Status EtcdStateStore::SaveProfile(const v1::Profile& p) {
  // The key holds the model key's bytes; etcd keys are bytes, any '/' in them is fine.
  return Guarded({PutOp(absl::StrCat(prefix_, "profiles/", p.model_key(), "\n", p.precision()),
                        p.SerializeAsString())});
}

absl::StatusOr<std::vector<v1::Profile>> EtcdStateStore::LoadProfiles() {
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->GetPrefix(prefix_ + "profiles/"));
  return ParseAll<v1::Profile>(kvs, "profile");
}

absl::Status EtcdStateStore::SaveEvent(const v1::Event& event) {
  RETURN_IF_ERROR(local_->SaveEvent(event));
  if (term_ == 0) return absl::OkStatus();  // not leading: nothing of it goes to etcd
  // In etcd before it counts as saved: a leader killed right after loses no event.
  newest_event_seq_ = std::max(newest_event_seq_, event.seq());
  events_dirty_ = true;  // the old ones are pruned in batches (Flush)
  return Guarded(
      {PutOp(absl::StrFormat("%sevents/%012d", prefix_, event.seq()), event.SerializeAsString())});
}

absl::StatusOr<std::vector<v1::Event>> EtcdStateStore::LoadEvents(int limit) {
  return local_->LoadEvents(limit);
}

absl::Status EtcdStateStore::SaveSteps(const std::string& job_id,
                                       const std::vector<v1::StepRecord>& steps) {
  steps_dirty_.insert(job_id);
  for (const v1::StepRecord& r : steps) {
    auto [it, fresh] = oldest_unflushed_.emplace(job_id, r.step());
    if (!fresh) it->second = std::min(it->second, r.step());
  }
  return local_->SaveSteps(job_id, steps);
}

absl::Status EtcdStateStore::ThinSteps(const std::string& job_id, int max_records) {
  steps_dirty_.insert(job_id);
  return local_->ThinSteps(job_id, max_records);
}

absl::StatusOr<std::vector<v1::StepRecord>> EtcdStateStore::LoadSteps(const std::string& job_id,
                                                                      int64_t after_step,
                                                                      int limit) {
  return local_->LoadSteps(job_id, after_step, limit);
}

int64_t EtcdStateStore::DurableStep(const std::string& job_id) const {
  auto it = durable_step_.find(job_id);
  int64_t durable = it == durable_step_.end() ? 0 : it->second;
  // A record older than the last flush's newest that came after it (an agent sending again
  // what a killed leader took with it) is not in etcd yet: nothing from it on is durable.
  if (auto u = oldest_unflushed_.find(job_id); u != oldest_unflushed_.end()) {
    durable = std::min(durable, u->second - 1);
  }
  return std::max<int64_t>(0, durable);
}

absl::Status EtcdStateStore::Sync() {
  if (term_ == 0 || absl::Now() - flushed_ < flush_) return absl::OkStatus();
  if (!events_dirty_ && steps_dirty_.empty()) return absl::OkStatus();
  flushed_ = absl::Now();
  return Flush();
}

absl::Status EtcdStateStore::Flush() {
  if (events_dirty_) {  // every event has its key (SaveEvent); the oldest go, and the old list
    etcdserverpb::RequestOp old;
    old.mutable_request_delete_range()->set_key(prefix_ + "events/");
    old.mutable_request_delete_range()->set_range_end(absl::StrFormat(
        "%sevents/%012d", prefix_, std::max<int64_t>(0, newest_event_seq_ - kEventsKept + 1)));
    RETURN_IF_ERROR(Guarded({std::move(old), DeleteOp(prefix_ + "events")}));
    events_dirty_ = false;
  }
  for (auto it = steps_dirty_.begin(); it != steps_dirty_.end(); it = steps_dirty_.erase(it)) {
    ASSIGN_OR_RETURN(std::vector<v1::StepRecord> all, local_->LoadSteps(*it, 0, 1 << 20));
    const int64_t newest = all.empty() ? 0 : all.back().step();
    // Chunks of at most kMaxChunkBytes, a transaction each (a job's records together can be
    // over etcd's request limit), then the stale chunks after them. A takeover between two
    // of these sees some new chunks and some old ones; TakeOver drops the repeated steps.
    const std::string dir = prefix_ + "steps/" + *it + "/";
    size_t n = 0;
    for (size_t i = 0; i < all.size(); ++n) {
      v1::GetMetricsResponse chunk;
      size_t bytes = 0;
      for (; i < all.size() && (bytes == 0 || bytes + all[i].ByteSizeLong() < kMaxChunkBytes);
           ++i) {
        bytes += all[i].ByteSizeLong() + 4;  // and its tag and length
        *chunk.add_steps() = all[i];
      }
      RETURN_IF_ERROR(
          Guarded({PutOp(absl::StrFormat("%s%06d", dir, n), chunk.SerializeAsString())}));
    }
    etcdserverpb::RequestOp stale;
    stale.mutable_request_delete_range()->set_key(absl::StrFormat("%s%06d", dir, n));
    stale.mutable_request_delete_range()->set_range_end(PrefixEnd(dir));
    RETURN_IF_ERROR(Guarded({std::move(stale)}));
    durable_step_[*it] = newest;
    oldest_unflushed_.erase(*it);
  }
  return absl::OkStatus();
}

}  // namespace varuna

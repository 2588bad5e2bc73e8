#pragma once

// The manager's state on etcd, for managers that take over from one another (Note [Leader
// lease] in manager/ha/leader_election.h). Under PREFIX: jobs/ID, specs/ID, nodes/NAME,
// profiles/KEY, one key each; every write is a transaction that applies only while
// PREFIX/leader still has the writer's term as its create revision, so a deposed leader
// cannot change anything (the write fails and the manager stops); a write that cannot reach
// etcd stops the manager too (what it acknowledged next could be lost).
//
// Note [High-rate state]: step records change every step; they are kept in the manager's
// local SQLite (state_dir) as with one manager, and copied to etcd in bounded batches at most
// every flush_period: PREFIX/steps/JOB/N (chunks of at most 256 KiB, a transaction each; a
// job keeps at most 4,000 records, Note [Step series]), each well under etcd's 1.5 MiB
// request limit. A takeover loads them back; what the last flush_period added the agents
// still hold and send again to the new leader (Note [Durable step records] in
// agent/heartbeat_report.cc). Events are rarer: each is written to PREFIX/events/SEQ before
// it counts as saved, and the batches prune all but the newest 2,000. So a takeover loses no
// event, step record, job, node, morph or profile change.

#include <map>
#include <memory>
#include <set>
#include <string>

#include "manager/ha/etcd_client.h"
#include "manager/state/state_store.h"

namespace varuna {

class EtcdStateStore final : public StateStore {
 public:
  // `prefix` ends with '/'; `local_dir` holds the SQLite copy of events and step records.
  // Touches no etcd key: a standby opens it, TakeOver loads it.
  static absl::StatusOr<std::unique_ptr<EtcdStateStore>> Open(EtcdClient* etcd,
                                                              const std::string& prefix,
                                                              const std::string& local_dir,
                                                              absl::Duration flush_period);
  // From now on every write is guarded by `term` (the leader key's create revision);
  // `on_deposed` runs when a guarded write finds another leader (the manager stops). Loads
  // the events and step records the last leader flushed (Note [High-rate state]).
  absl::Status TakeOver(int64_t term, std::function<void(const std::string&)> on_deposed);

  absl::Status SaveJob(const v1::JobRecord& job) override;
  absl::Status SaveNode(const v1::NodeRecord& node) override;
  absl::Status DeleteNode(const std::string& name) override;
  absl::Status SaveSpec(const std::string& job_id, const std::string& yaml) override;
  absl::StatusOr<std::string> LoadSpec(const std::string& job_id) override;
  absl::Status DeleteJob(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::JobRecord>> LoadJobs() override;
  absl::StatusOr<std::vector<v1::NodeRecord>> LoadNodes() override;
  absl::Status SaveProfile(const v1::Profile& profile) override;
  absl::StatusOr<std::vector<v1::Profile>> LoadProfiles() override;
  absl::Status SaveEvent(const v1::Event& event) override;
  absl::StatusOr<std::vector<v1::Event>> LoadEvents(int limit) override;
  absl::Status SaveSteps(const std::string& job_id,
                         const std::vector<v1::StepRecord>& steps) override;
  absl::Status ThinSteps(const std::string& job_id, int max_records) override;
  absl::StatusOr<std::vector<v1::StepRecord>> LoadSteps(const std::string& job_id,
                                                        int64_t after_step, int limit) override;
  // Copies what changed of the high-rate state to etcd when flush_period has passed.
  absl::Status Sync() override;
  // What the last flush put in etcd (a takeover loads it), or what TakeOver loaded.
  int64_t DurableStep(const std::string& job_id) const override;

 private:
  EtcdStateStore(EtcdClient* etcd, std::string prefix, std::unique_ptr<SqliteStateStore> local,
                 absl::Duration flush_period)
      : etcd_(etcd), prefix_(std::move(prefix)), local_(std::move(local)), flush_(flush_period) {}
  // Applies `ops` if this manager still leads; FailedPrecondition (and on_deposed) if not.
  absl::Status Guarded(std::vector<etcdserverpb::RequestOp> ops);
  absl::Status Flush();

  EtcdClient* const etcd_;
  const std::string prefix_;
  std::unique_ptr<SqliteStateStore> local_;
  const absl::Duration flush_;
  int64_t term_ = 0;
  std::function<void(const std::string&)> on_deposed_;
  bool events_dirty_ = false;
  std::set<std::string> steps_dirty_;
  std::map<std::string, int64_t> durable_step_;      // per job: the newest step in etcd
  std::map<std::string, int64_t> oldest_unflushed_;  // per job: the oldest step saved since
  int64_t newest_event_seq_ = 0;
  absl::Time flushed_ = absl::InfinitePast();
};

}  // namespace varuna

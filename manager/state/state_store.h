#pragma once

// The manager's durable state: every job and node record (protobuf rows), specs, profiles,
// events and step records. Writes are synchronous and durable before they return, so a
// manager killed at any moment restarts with everything it acknowledged.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "varuna/v1/control.pb.h"

struct sqlite3;

namespace varuna {

// A record of a store's that does not parse: job records load as a stub naming `key` and why
// (JobRecord.quarantined, id and seq from the key), so the job can be FAILED and the manager
// still lead (Note [Records on load] in manager/jobs/job_table.cc); node records are skipped
// (their agents register again). Returns false when the record is dropped.
bool QuarantineCorrupt(const std::string& key, const std::string& id, size_t bytes,
                       v1::JobRecord* stub);
bool QuarantineCorrupt(const std::string& key, const std::string& id, size_t bytes,
                       v1::NodeRecord* stub);

// What the manager persists, behind one interface: SQLite on one machine (the default), or
// etcd for managers that take over from one another (manager/ha/etcd_store.h).
class StateStore {
 public:
  // Opens (creating if needed) `dir`/manager.db. Errors name the path.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  virtual ~StateStore() = default;

  virtual absl::Status SaveJob(const v1::JobRecord& job) = 0;
  virtual absl::Status SaveNode(const v1::NodeRecord& node) = 0;
  virtual absl::Status DeleteNode(const std::string& name) = 0;
  // A job's spec text, written once at submit and read when its workers launch (Note
  // [Retention] in manager/jobs/job_table.cc: specs are not held in memory).
  virtual absl::Status SaveSpec(const std::string& job_id, const std::string& yaml) = 0;
  virtual absl::StatusOr<std::string> LoadSpec(const std::string& job_id) = 0;
  // A job's record, spec and step records (retention).
  virtual absl::Status DeleteJob(const std::string& job_id) = 0;
  // All jobs, in submission order.
  virtual absl::StatusOr<std::vector<v1::JobRecord>> LoadJobs() = 0;
  virtual absl::StatusOr<std::vector<v1::NodeRecord>> LoadNodes() = 0;
  // Profiles (docs/autoconfig.md), one per (model key, precision); a new one replaces it.
  virtual absl::Status SaveProfile(const v1::Profile& profile) = 0;
  virtual absl::StatusOr<std::vector<v1::Profile>> LoadProfiles() = 0;
  // Events (varunactl events): appended; the newest `limit` come back oldest first.
  virtual absl::Status SaveEvent(const v1::Event& event) = 0;
  virtual absl::StatusOr<std::vector<v1::Event>> LoadEvents(int limit) = 0;
  // Per-step records of a job (varunactl metrics), one per step (Note [Step records]).
  virtual absl::Status SaveSteps(const std::string& job_id,
                                 const std::vector<v1::StepRecord>& steps) = 0;
  // Keeps at most about `max_records` step records for the job by merging pairs of older
  // ones (Note [Step series] in manager/jobs/step_series.cc).
  virtual absl::Status ThinSteps(const std::string& job_id, int max_records) = 0;
  virtual absl::StatusOr<std::vector<v1::StepRecord>> LoadSteps(const std::string& job_id,
                                                                int64_t after_step, int limit) = 0;
  // Called about once a second: a store that batches writes sends them now (etcd; Note
  // [High-rate state] in manager/ha/etcd_store.h).
  virtual absl::Status Sync() { return absl::OkStatus(); }
  // The newest step of the job whose record a restarted or new leading manager would load
  // (0: none yet): what SaveSteps wrote here, or what reached etcd.
  virtual int64_t DurableStep(const std::string& job_id) const = 0;
};

// The SQLite store: one database file, every write durable before it returns.
class SqliteStateStore final : public StateStore {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteStateStore>> Open(const std::string& dir);
  ~SqliteStateStore() override;

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
  int64_t DurableStep(const std::string& job_id) const override;
  // Every event and step record, replaced (a takeover's copy from etcd, manager/ha/etcd_store.h).
  absl::Status ReplaceEventsAndSteps(
      const std::vector<v1::Event>& events,
      const std::map<std::string, std::vector<v1::StepRecord>>& steps);

 private:
  explicit SqliteStateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const std::string& sql);
  absl::Status Delete(const char* sql, const std::string& key);
  absl::Status Put(const char* sql, const std::string& key, int64_t seq, const std::string& blob);

  sqlite3* db_;
  const std::string path_;
  std::map<std::string, int64_t> saved_step_;  // per job: the newest step SaveSteps wrote
};

}  // namespace varuna

#pragma once

// The manager's durable state: one SQLite database under --state_dir holding every job and
// node record (protobuf rows). Writes are synchronous and durable before they return, so a
// manager killed at any moment restarts with everything it acknowledged.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "varuna/v1/control.pb.h"

struct sqlite3;

namespace varuna {

class StateStore {
 public:
  // Opens (creating if needed) `dir`/manager.db. Errors name the path.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  ~StateStore();

  absl::Status SaveJob(const v1::JobRecord& job);
  absl::Status SaveNode(const v1::NodeRecord& node);
  absl::Status DeleteNode(const std::string& name);
  // A job's spec text, written once at submit and read when its workers launch (Note
  // [Retention] in manager/job_table.cc: specs are not held in memory).
  absl::Status SaveSpec(const std::string& job_id, const std::string& yaml);
  absl::StatusOr<std::string> LoadSpec(const std::string& job_id);
  // A job's record, spec and step records (retention).
  absl::Status DeleteJob(const std::string& job_id);
  // All jobs, in submission order.
  absl::StatusOr<std::vector<v1::JobRecord>> LoadJobs();
  absl::StatusOr<std::vector<v1::NodeRecord>> LoadNodes();
  // Profiles (docs/autoconfig.md), one per (model key, precision); a new one replaces it.
  absl::Status SaveProfile(const v1::Profile& profile);
  absl::StatusOr<std::vector<v1::Profile>> LoadProfiles();
  // Events (varunactl events): appended; the newest `limit` come back oldest first.
  absl::Status SaveEvent(const v1::Event& event);
  absl::StatusOr<std::vector<v1::Event>> LoadEvents(int limit);
  // Per-step records of a job (varunactl metrics), one per step (Note [Step records]).
  absl::Status SaveSteps(const std::string& job_id, const std::vector<v1::StepRecord>& steps);
  // Keeps at most about `max_records` step records for the job by merging pairs of older
  // ones (Note [Step series] in manager/step_series.cc).
  absl::Status ThinSteps(const std::string& job_id, int max_records);
  absl::StatusOr<std::vector<v1::StepRecord>> LoadSteps(const std::string& job_id,
                                                        int64_t after_step, int limit);

 private:
  explicit StateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const std::string& sql);
  absl::Status Delete(const char* sql, const std::string& key);
  absl::Status Put(const char* sql, const std::string& key, int64_t seq, const std::string& blob);

  sqlite3* db_;
  const std::string path_;
};

}  // namespace varuna

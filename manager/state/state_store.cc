#include "manager/state/state_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace varuna {

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteStateStore> store, SqliteStateStore::Open(dir));
  return std::unique_ptr<StateStore>(std::move(store));
}

absl::StatusOr<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("--state_dir ", dir, " cannot be created: ", ec.message()));
  }
  const std::string path = dir + "/manager.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open state database ", path, ": ", msg));
  }
  std::unique_ptr<SqliteStateStore> store(new SqliteStateStore(db, path));
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=FULL",
           "PRAGMA busy_timeout=5000",
           "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, seq INTEGER, record BLOB)",
           "CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, seq INTEGER, record BLOB)",
           "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, record BLOB)",
           "CREATE TABLE IF NOT EXISTS steps (job TEXT, step INTEGER, gen INTEGER, record BLOB, "
           "PRIMARY KEY (job, step))",
           "CREATE TABLE IF NOT EXISTS profiles (key TEXT PRIMARY KEY, seq INTEGER, record BLOB)",
           "CREATE TABLE IF NOT EXISTS specs (id TEXT PRIMARY KEY, seq INTEGER, yaml BLOB)",
       }) {
    absl::Status s = store->Exec(sql);
    if (!s.ok()) return s;
  }
  return store;
}

SqliteStateStore::~SqliteStateStore() { sqlite3_close(db_); }

absl::Status SqliteStateStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err != nullptr ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", msg, " in: ", sql));
  }
  return absl::OkStatus();
}

absl::Status SqliteStateStore::Put(const char* sql, const std::string& key, int64_t seq,
                                   const std::string& blob) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, seq);
  sqlite3_bind_blob(stmt, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::InternalError(
        absl::StrCat("state database ", path_, ": write failed: ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

absl::Status SqliteStateStore::SaveJob(const v1::JobRecord& job) {
  return Put("INSERT OR REPLACE INTO jobs (id, seq, record) VALUES (?, ?, ?)", job.info().id(),
             job.seq(), job.SerializeAsString());
}

absl::Status SqliteStateStore::SaveNode(const v1::NodeRecord& node) {
  return Put("INSERT OR REPLACE INTO nodes (name, seq, record) VALUES (?, ?, ?)", node.name(), 0,
             node.SerializeAsString());
}

absl::Status SqliteStateStore::DeleteNode(const std::string& name) {
  return Delete("DELETE FROM nodes WHERE name = ?", name);
}

absl::Status SqliteStateStore::SaveSpec(const std::string& job_id, const std::string& yaml) {
  return Put("INSERT OR REPLACE INTO specs (id, seq, yaml) VALUES (?, ?, ?)", job_id, 0, yaml);
}

absl::StatusOr<std::string> SqliteStateStore::LoadSpec(const std::string& job_id) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT yaml FROM specs WHERE id = ?", -1, &stmt, nullptr) !=
      SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(stmt);
  std::string yaml;
  if (rc == SQLITE_ROW) {
    yaml.assign(static_cast<const char*>(sqlite3_column_blob(stmt, 0)),
                static_cast<size_t>(sqlite3_column_bytes(stmt, 0)));
  }
  sqlite3_finalize(stmt);
  if (rc == SQLITE_DONE) {
    return absl::NotFoundError(absl::StrCat("state database ", path_, ": no spec of job ", job_id));
  }
  if (rc != SQLITE_ROW) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  return yaml;
}

absl::Status SqliteStateStore::DeleteJob(const std::string& job_id) {
  saved_step_.erase(job_id);
  RETURN_IF_ERROR(Delete("DELETE FROM steps WHERE job = ?", job_id));
  RETURN_IF_ERROR(Delete("DELETE FROM specs WHERE id = ?", job_id));
  return Delete("DELETE FROM jobs WHERE id = ?", job_id);
}

absl::Status SqliteStateStore::Delete(const char* sql, const std::string& key) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::InternalError(
        absl::StrCat("state database ", path_, ": delete failed: ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

bool QuarantineCorrupt(const std::string& key, const std::string& id, size_t bytes,
                       v1::JobRecord* stub) {
  int64_t seq = 0;
  if (!absl::SimpleAtoi(id, &seq)) seq = 0;
  stub->Clear();
  stub->set_seq(seq);
  stub->mutable_info()->set_id(id);
  stub->set_quarantined(
      absl::StrCat("the job's record at ", key, " (", bytes, " bytes) does not parse"));
  LOG(ERROR) << "state: " << stub->quarantined() << "; the job is quarantined";
  return true;
}

bool QuarantineCorrupt(const std::string& key, const std::string& id, size_t bytes,
                       v1::NodeRecord* stub) {
  LOG(ERROR) << "state: the node record at " << key << " (" << bytes
             << " bytes) does not parse; skipped (its agent registers again)";
  return false;
}

namespace {

// Rows of `sql` (record, key), parsed; a corrupt one is QuarantineCorrupt's.
template <typename T>
absl::StatusOr<std::vector<T>> LoadRecords(sqlite3* db, const char* sql, const std::string& path,
                                           const char* table) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path, ": ", sqlite3_errmsg(db)));
  }
  std::vector<T> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    T rec;
    const void* blob = sqlite3_column_blob(stmt, 0);
    const int n = sqlite3_column_bytes(stmt, 0);
    const unsigned char* key = sqlite3_column_text(stmt, 1);
    const std::string id = key != nullptr ? reinterpret_cast<const char*>(key) : "";
    if (rec.ParseFromArray(blob, n) ||
        QuarantineCorrupt(absl::StrCat(path, " table ", table, " row ", id), id, n, &rec)) {
      out.push_back(std::move(rec));
    }
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat("state database ", path, ": ", sqlite3_errmsg(db)));
  }
  return out;
}

template <typename T>
absl::StatusOr<std::vector<T>> LoadAll(sqlite3* db, const char* sql, const std::string& path) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path, ": ", sqlite3_errmsg(db)));
  }
  std::vector<T> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    T rec;
    const void* blob = sqlite3_column_blob(stmt, 0);
    const int n = sqlite3_column_bytes(stmt, 0);
    if (!rec.ParseFromArray(blob, n)) {  // one bad row must not stop the manager
      LOG(ERROR) << "state database " << path << ": a corrupt " << T::descriptor()->name()
                 << " row; skipped";
      continue;
    }
    out.push_back(std::move(rec));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat("state database ", path, ": ", sqlite3_errmsg(db)));
  }
  return out;
}

}  // namespace

absl::Status SqliteStateStore::SaveProfile(const v1::Profile& p) {
  return Put("INSERT OR REPLACE INTO profiles (key, seq, record) VALUES (?1, ?2, ?3)",
             absl::StrCat(p.model_key(), "\n", p.precision()), 0, p.SerializeAsString());
}

absl::StatusOr<std::vector<v1::Profile>> SqliteStateStore::LoadProfiles() {
  return LoadAll<v1::Profile>(db_, "SELECT record FROM profiles ORDER BY key", path_);
}

absl::Status SqliteStateStore::SaveEvent(const v1::Event& e) {
  RETURN_IF_ERROR(Put("INSERT OR REPLACE INTO events (seq, record) VALUES (?2, ?3)", "", e.seq(),
                      e.SerializeAsString()));
  // Keep the newest 100000.
  if (e.seq() % 1000 == 0) {
    return Exec(absl::StrCat("DELETE FROM events WHERE seq <= ", e.seq() - 100000));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Event>> SqliteStateStore::LoadEvents(int limit) {
  auto newest = LoadAll<v1::Event>(
      db_, absl::StrCat("SELECT record FROM events ORDER BY seq DESC LIMIT ", limit).c_str(),
      path_);
  if (newest.ok()) std::reverse(newest->begin(), newest->end());
  return newest;
}

int64_t SqliteStateStore::DurableStep(const std::string& job_id) const {
  auto it = saved_step_.find(job_id);
  return it == saved_step_.end() ? 0 : it->second;
}

// Note [Step records]: a step re-run by a later generation (after a morph rolled back to a
// checkpoint) replaces the earlier record; an older generation never overwrites a newer one.
absl::Status SqliteStateStore::SaveSteps(const std::string& job_id,
                                         const std::vector<v1::StepRecord>& steps) {
  RETURN_IF_ERROR(Exec("BEGIN"));
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "INSERT INTO steps (job, step, gen, record) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT (job, step) DO UPDATE SET gen = excluded.gen, "
                         "record = excluded.record WHERE excluded.gen >= steps.gen",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    const std::string msg = sqlite3_errmsg(db_);
    Exec("ROLLBACK").IgnoreError();
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", msg));
  }
  int rc = SQLITE_DONE;
  for (const v1::StepRecord& r : steps) {
    const std::string blob = r.SerializeAsString();
    sqlite3_reset(stmt);
    sqlite3_bind_text(stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(stmt, 2, r.step());
    sqlite3_bind_int64(stmt, 3, r.generation());
    sqlite3_bind_blob(stmt, 4, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    rc = sqlite3_step(stmt);
    if (rc != SQLITE_DONE) break;
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    const std::string msg = sqlite3_errmsg(db_);
    Exec("ROLLBACK").IgnoreError();
    return absl::InternalError(absl::StrCat("state database ", path_, ": write failed: ", msg));
  }
  RETURN_IF_ERROR(Exec("COMMIT"));
  int64_t& saved = saved_step_[job_id];
  for (const v1::StepRecord& r : steps) saved = std::max<int64_t>(saved, r.step());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::StepRecord>> SqliteStateStore::LoadSteps(const std::string& job_id,
                                                                        int64_t after_step,
                                                                        int limit) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "SELECT record FROM steps WHERE job = ? AND step > ? ORDER BY step "
                         "LIMIT ?",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(stmt, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, after_step);
  sqlite3_bind_int(stmt, 3, limit);
  std::vector<v1::StepRecord> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    v1::StepRecord r;
    if (r.ParseFromArray(sqlite3_column_blob(stmt, 0), sqlite3_column_bytes(stmt, 0))) {
      out.push_back(std::move(r));
    }
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  return out;
}

// Note [Step series] in step_series.cc: pairs of records in the older half are merged into one (the
// first step of the pair, values averaged by how many raw steps each stands for).
absl::Status SqliteStateStore::ThinSteps(const std::string& job_id, int max_records) {
  sqlite3_stmt* count = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT COUNT(*) FROM steps WHERE job = ?", -1, &count, nullptr) !=
      SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(count, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
  int64_t n = 0;
  if (sqlite3_step(count) == SQLITE_ROW) n = sqlite3_column_int64(count, 0);
  sqlite3_finalize(count);
  if (n <= max_records) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<v1::StepRecord> all, LoadSteps(job_id, 0, static_cast<int>(n)));
  std::vector<v1::StepRecord> keep;
  std::vector<int64_t> drop;
  const size_t older = all.size() / 2;
  for (size_t i = 0; i + 1 < older; i += 2) {
    v1::StepRecord a = all[i];
    const v1::StepRecord& b = all[i + 1];
    const double wa = std::max(1, a.merged()), wb = std::max(1, b.merged()), w = wa + wb;
    // A non-finite value (a diverged step) must not spread: average the finite ones.
    auto mean = [&](double x, double y) {
      const bool fx = std::isfinite(x), fy = std::isfinite(y);
      if (fx && fy) return (x * wa + y * wb) / w;
      return fx ? x : y;
    };
    a.set_loss(mean(a.loss(), b.loss()));
    a.set_samples_per_s(mean(a.samples_per_s(), b.samples_per_s()));
    a.set_step_time_s(mean(a.step_time_s(), b.step_time_s()));
    a.set_tokens_per_s(mean(a.tokens_per_s(), b.tokens_per_s()));
    a.set_grad_norm(mean(a.grad_norm(), b.grad_norm()));
    a.set_bubble_ratio(mean(a.bubble_ratio(), b.bubble_ratio()));
    a.set_mfu(mean(a.mfu(), b.mfu()));
    // Validation losses are sparse: a merged record keeps the newer one it stands for.
    if (b.has_eval_loss() && (std::isfinite(b.eval_loss()) || !a.has_eval_loss())) {
      a.set_eval_loss(b.eval_loss());
    }
    a.set_generation(std::max(a.generation(), b.generation()));
    a.set_merged(static_cast<int32_t>(w));
    keep.push_back(std::move(a));
    drop.push_back(b.step());
  }
  RETURN_IF_ERROR(Exec("BEGIN"));
  sqlite3_stmt* upd = nullptr;
  sqlite3_stmt* del = nullptr;
  absl::Status st;
  if (sqlite3_prepare_v2(db_, "UPDATE steps SET gen = ?, record = ? WHERE job = ? AND step = ?", -1,
                         &upd, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, "DELETE FROM steps WHERE job = ? AND step = ?", -1, &del, nullptr) !=
          SQLITE_OK) {
    st = absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  for (size_t i = 0; st.ok() && i < keep.size(); ++i) {
    const std::string blob = keep[i].SerializeAsString();
    sqlite3_reset(upd);
    sqlite3_bind_int64(upd, 1, keep[i].generation());
    sqlite3_bind_blob(upd, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(upd, 3, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(upd, 4, keep[i].step());
    sqlite3_reset(del);
    sqlite3_bind_text(del, 1, job_id.data(), static_cast<int>(job_id.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(del, 2, drop[i]);
    if (sqlite3_step(upd) != SQLITE_DONE || sqlite3_step(del) != SQLITE_DONE) {
      st = absl::InternalError(absl::StrCat("state database ", path_, ": ", sqlite3_errmsg(db_)));
    }
  }
  sqlite3_finalize(upd);
  sqlite3_finalize(del);
  if (!st.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return st;
  }
  return Exec("COMMIT");
}

absl::StatusOr<std::vector<v1::JobRecord>> SqliteStateStore::LoadJobs() {
  return LoadRecords<v1::JobRecord>(db_, "SELECT record, id FROM jobs ORDER BY seq", path_, "jobs");
}

absl::StatusOr<std::vector<v1::NodeRecord>> SqliteStateStore::LoadNodes() {
  return LoadRecords<v1::NodeRecord>(db_, "SELECT record, name FROM nodes ORDER BY name", path_,
                                     "nodes");
}

absl::Status SqliteStateStore::ReplaceEventsAndSteps(
    const std::vector<v1::Event>& events,
    const std::map<std::string, std::vector<v1::StepRecord>>& steps) {
  RETURN_IF_ERROR(Exec("DELETE FROM events"));
  RETURN_IF_ERROR(Exec("DELETE FROM steps"));
  for (const v1::Event& e : events) RETURN_IF_ERROR(SaveEvent(e));
  for (const auto& [job, records] : steps) RETURN_IF_ERROR(SaveSteps(job, records));
  return absl::OkStatus();
}

}  // namespace varuna

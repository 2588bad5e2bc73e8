#pragma once

// The jobs the manager knows, in submission order, with their persistence and the slot
// accounting every placement decision starts from. Loop thread only.

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "manager/jobs/job.h"
#include "manager/nodes/node_table.h"
#include "manager/nodes/placement.h"
#include "manager/state/state_store.h"

namespace varuna {

class JobTable {
 public:
  JobTable(StateStore* store, const NodeTable* nodes) : store_(store), nodes_(nodes) {}

  // Loads every job from the store (records checked, specs parsed again; a bad one loads
  // FAILED, quarantined: Note [Records on load] in job_table.cc). Generation state starts
  // from `now` (timers restart on recovery). Errors: the store cannot be read or written.
  absl::Status Load(absl::Time now);

  // The newest step of job `id` whose record is durable (StateStore::DurableStep).
  int64_t DurableStep(const std::string& id) const { return store_->DurableStep(id); }

  // Adds a new job with the next sequence number as its id (Note [Job ids] in job_table.cc:
  // never below the seconds from 2025 to `now`), persisted. Returns it.
  Job& Add(Job job, absl::Time now);
  Job* Find(const std::string& id);
  const Job* Find(const std::string& id) const;
  // NotFound "no job with id 'X'".
  absl::StatusOr<Job*> Get(const std::string& id);
  // The job `user`'s submit with this request id created, if any (submits are idempotent;
  // another user's equal request id is another request and reveals nothing of this one).
  Job* ByRequest(const std::string& user, const std::string& request_id);
  const std::vector<std::string>& order() const { return order_; }
  std::map<std::string, Job>& all() { return jobs_; }
  const std::map<std::string, Job>& all() const { return jobs_; }

  // Writes the job's record. Losing the state database is not something to run on through:
  // a failed write stops the manager (CHECK).
  void Persist(Job& job);
  // The job's spec text, from the store (Note [Retention] in job_table.cc); CHECKs like Persist.
  std::string SpecYaml(const std::string& id) const;
  // Removes finished jobs past the retention policy (the oldest beyond `max_finished`, and
  // those finished more than `ttl` ago; ttl 0 = no age limit) from memory and the store.
  // Returns their ids.
  std::vector<std::string> Prune(absl::Time now, int max_finished, absl::Duration ttl);

  // Slots in use per node: the live ranks of active jobs (a job between generations keeps
  // all of its slots) and workers of no active launch.
  std::map<std::string, int> UsedSlots() const;
  // Free slots on schedulable nodes not in `exclude`, counting `job`'s own live ranks as
  // free (its next generation replaces them), and not the nodes `job` evicted as stragglers.
  std::vector<FreeSlots> FreeSlotsFor(const Job* job, const std::set<std::string>& exclude) const;

 private:
  // Makes `rec` a FAILED job whose reason names the record and `why`, and saves it.
  void Quarantine(v1::JobRecord* rec, const absl::Status& why);

  StateStore* const store_;
  const NodeTable* const nodes_;
  std::map<std::string, Job> jobs_;  // by id
  std::vector<std::string> order_;   // ids in submission order
  // (submitter, request id) -> job id
  std::map<std::pair<std::string, std::string>, std::string> by_request_;
  int64_t next_seq_ = 1;
};

}  // namespace varuna

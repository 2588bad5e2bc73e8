#pragma once

// A job as the manager holds it: its record (what is persisted), its parsed spec, and what
// belongs to its current generation; plus the small facts every component asks of a job.
// docs/architecture.md "Control plane" draws the job's states.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "manager/nodes/placement.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

// Everything that belongs to one launch of a job; NewGeneration() resets it.
struct Generation {
  std::set<std::string> launch_pending;  // nodes whose Launch has not been acked
  absl::Time starting_since;
  absl::Time running_since;  // since RUNNING, or since this manager recovered the job
  // Note [Failure attribution]: without morphing, a rank's non-zero exit is held for two
  // heartbeat periods before the job fails, so that when a whole node died (and its peers'
  // collectives failed first) the reason names the lost node rather than a healthy rank.
  std::string pending_failure;
  // A rank its node's agent stopped reporting (CheckUnreported); preferred as the cause.
  std::optional<std::pair<std::string, int>> unreported;  // (node, rank)
  absl::Time fail_at = absl::InfiniteFuture();
  // The step after which a rank reported stopping on request (SIGUSR1); 0 if none did.
  int64_t stopped_after = 0;
  std::set<int> ready;              // ranks that reported their rendezvous done
  std::set<int> frozen;             // ranks whose process is stopped (Note [Frozen workers])
  std::set<int> parked;             // ranks waiting to regroup (Note [Morph in place])
  int64_t resumed_from = -1;        // the step they resumed after (-1 until known)
  int64_t newest_step = 0;          // newest step this generation reported
  std::vector<bool> counted_steps;  // steps the metrics took (StepSeries::Record)
  std::string worker_error;         // the first error line a worker wrote
  // Note [Launch failures that repeat] in job_controller.cc: ranks that never started (rank ->
  // "rank R on node N: reason"), and when the morph they hold back starts anyway.
  std::map<int, std::string> launch_failed;
  absl::Time launch_settle_at = absl::InfiniteFuture();
  double last_ready_at = 0;  // the workers' clock: when the last rank reported ready
  double first_step_at = 0;  // ... and when the first step after resumed_from ended
  // A profile job's report was handled (stored, or refused with worker_error set).
  bool profile_handled = false;
  bool profile_stored = false;
};

struct Job {
  v1::JobRecord rec;
  JobSpec spec;
  Generation gen;
  absl::Time last_stop_sent = absl::InfinitePast();
  absl::Time cancelling_since;  // since CANCELLING, or since this manager recovered the job
  absl::Time last_trigger = absl::InfinitePast();  // the newest cause merged into a morph
  // The trigger whose coalescing window the morph record counted last (Note [Coalescing
  // window] in manager/morph/morph_controller.cc).
  std::optional<absl::Time> coalesce_counted;
  int cause_priority = 0;  // of the morph's reason (Cause)
  bool progress_dirty = false;
  v1::JobInfo& info() { return *rec.mutable_info(); }
  const v1::JobInfo& info() const { return rec.info(); }
  v1::MorphState& morph() { return *rec.mutable_morph(); }
  bool morphing() const { return rec.morph().phase() != v1::MorphState::NONE; }
};

// Why a running job must change (docs/morphing.md "Triggers"). Higher priority causes
// replace the reason of a morph in progress (a lost node explains its peers' exits).
struct Cause {
  // For machines (MorphRecord.kind): lost, notice, drain, join, failed, straggler, recovered;
  // the allocator's: resize, evict (JobRecord.evicted: the morph ends PENDING).
  std::string kind = "failed";
  std::string reason;
  bool graceful = false;                         // the workers can checkpoint at a step boundary
  std::set<std::string> leaving;                 // nodes the next plan must not use
  absl::Duration detect = absl::ZeroDuration();  // from the event to the manager knowing
  int priority = 1;  // 1 a rank saved after a peer failed, 2 a worker failed, 3 a node event
  std::vector<v1::NodeSpeed> speeds;  // a straggler or recovered morph: what was measured
};

// Tensor-parallel ranks per position of the job's current plan (1: none), and the placement
// of each position (its tp rank 0 process; Note [Tensor-parallel placement] in placement.cc):
// what the topology's ranks index.
int TpOf(const v1::JobInfo& info);
std::map<int, std::string> PositionNodes(const v1::JobInfo& info);

// "job=ID gen=N": the subject of every log line about a job.
std::string JobWho(const v1::JobInfo& info);
// The host part of "host:port" (the whole string when it has no port).
std::string HostOf(const std::string& address);
// "SIGKILL", ..., or "signal N".
std::string SignalName(int sig);
// The manager's timestamps: RFC 3339 UTC to the second, and Unix seconds.
std::string TimeText(absl::Time t);
double UnixSeconds(absl::Time t);

// STARTING, RUNNING, RECONFIGURING or CANCELLING: the job has (or may have) workers.
bool Active(v1::JobState s);
bool Terminal(v1::JobState s);
// Between generations (a morph saving, stopping or re-planning): the job keeps its slots.
bool Reserving(const Job& job);
// Whether `rank` of the job's current generation is placed on `node`.
bool PlacedOn(const Job& job, const std::string& node, int rank);
// The job's morph records that began within `window` before `now` (the restart budget), the
// allocator's (kind resize or evict) left out.
std::vector<const v1::MorphRecord*> RecentMorphs(const Job& job, absl::Time now,
                                                 absl::Duration window);
// "rank 3" or "ranks 2,3": the job's ranks on `node`.
std::string RanksOn(const Job& job, const std::string& node);

// "rank R on node N is no longer known to its agent (agent restarted?)".
std::string UnreportedReason(const std::pair<std::string, int>& node_rank);

// Starts a new generation's bookkeeping (exits, readiness, timers from `now`).
void NewGeneration(Job& job, absl::Time now);
// Copies a plan into the job's info: shape, schedule, boundaries, placement, and a master
// address on the first rank's host with port 0 (Note [Launch order] in job_controller.cc).
void ApplyPlan(v1::JobInfo& info, const JobPlan& plan, const std::string& first_node_address);

}  // namespace varuna

#pragma once

// What the agent's heartbeats carry besides each worker's row, and what of it the manager has
// acknowledged. The report owns the preemption notice, the startup probe's score, whether a
// heartbeat is due at once, which step records each job generation has forwarded, and the
// budget that keeps every heartbeat under kMaxHeartbeatBytes (Note [Heartbeat budget] in
// heartbeat_report.cc). The agent builds each worker's row and keeps each worker's step records
// (`Steps`, so they move with a worker adopted under a new rank); the report fills a heartbeat
// from them and acknowledges them. On the agent's event loop thread, like the agent.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "varuna/v1/control.pb.h"
#include "varuna/v1/worker.pb.h"

namespace varuna {

// What one heartbeat may carry at most (Note [Heartbeat budget] in heartbeat_report.cc); the
// manager accepts 4 MiB.
inline constexpr size_t kMaxHeartbeatBytes = 2 << 20;

class HeartbeatReport {
 public:
  // One worker's step records for the manager: queued as its progress file is read, carried
  // by heartbeats, dropped once the manager acknowledged the heartbeat that carried them.
  struct Steps {
    std::deque<v1::StepMetrics> pending;  // not yet acknowledged by the manager
    size_t in_flight = 0;                 // how many of `pending` the last heartbeat carried
    // Acknowledged, but not yet durable where a new leader would load them (Note [Durable step
    // records] in heartbeat_report.cc): sent again if another manager takes over.
    std::deque<v1::StepMetrics> unconfirmed;
    bool empty() const { return pending.empty() && unconfirmed.empty(); }
  };
  // One worker in a heartbeat being built: its row, its profile (a profile job's result, rank
  // 0; "" if none) and its step records.
  struct Row {
    v1::WorkerStatus* status;
    const std::string* profile_json;
    Steps* steps;
  };

  // `node`: the node's name, which every heartbeat carries.
  explicit HeartbeatReport(std::string node);

  // A preemption notice for this machine (from the file, the cloud poller or a test); sent
  // with every heartbeat from now on. The first one makes a heartbeat due at once.
  void SetNotice(const v1::PreemptionNotice& notice);
  const std::optional<v1::PreemptionNotice>& notice() const { return notice_; }
  // The startup speed probe's score (Note [Speed probe] in probe.cc), sent in heartbeats.
  void set_probe_score(double score) { probe_score_ = score; }
  // A heartbeat is worth sending right away (a worker exited, parked or froze).
  void MarkUrgent() { urgent_ = true; }
  // True once after MarkUrgent or a first notice.
  bool TakeUrgent();

  // Queues the step record `m` of a worker of `job_id`'s `generation` in `steps`, unless a
  // record of that step or a later one was already queued for that generation: every rank
  // reports the same global loss, so each step goes once from this node, from whichever rank
  // wrote it first.
  void Queue(const std::string& job_id, int generation, const v1::StepMetrics& m, Steps* steps);

  // A heartbeat's head: the node's name, the notice if any, the probe score. The agent adds a
  // row per worker, then calls Fill.
  v1::HeartbeatRequest Begin() const;
  // Adds to `hb` (its rows all in) what can be large, while it stays under kMaxHeartbeatBytes:
  // profiles, then step records oldest first; each worker's in-flight count becomes what
  // this heartbeat carries of its records (Note [Heartbeat budget] in heartbeat_report.cc).
  void Fill(v1::HeartbeatRequest* hb, const std::vector<Row>& rows) const;
  // The manager (of `term`) answered the last heartbeat: the step records it carried are
  // acknowledged; those up to `durable_step` are kept no longer, the others until they are,
  // and all of them go again to a manager of another term.
  void Acknowledge(Steps* steps, int64_t durable_step, bool new_term) const;

 private:
  const std::string node_;
  std::optional<v1::PreemptionNotice> notice_;
  bool urgent_ = false;
  double probe_score_ = 0;
  std::map<std::string, int64_t> forwarded_step_;  // "job/gen" -> newest step queued
};

}  // namespace varuna

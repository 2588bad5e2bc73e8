#pragma once

// varuna-manager's metrics (docs/observability.md has the list). Updated by Manager inside
// its transitions, on the loop thread; read by GET /metrics from an HTTP thread
// (prometheus-cpp's metrics are thread-safe).

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/net/metrics.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class ManagerMetrics {
 public:
  explicit ManagerMetrics(MetricsRegistry& r);

  // Nodes by state and each node's slots (recomputed when a node changes state or slots).
  void SetNodes(const std::vector<v1::NodeInfo>& nodes);
  void SetJobs(const std::map<std::string, double>& by_state);
  // Slots each active job holds (or is allocated, with sharing) and their sum by user.
  void SetAllocations(const std::map<std::string, int>& by_job,
                      const std::map<std::string, int>& by_user);
  // New step records of a job (gauges to the newest, each step time into the histogram).
  void OnSteps(const std::string& job, const std::vector<v1::StepRecord>& steps);
  // A finished morph: counted by the kind of its reason; each phase's duration observed.
  void OnMorph(const std::string& job, const v1::MorphRecord& morph);
  void OnHeartbeat(const std::string& node, double latency_s);
  // 1 while this manager leads (always when alone); OnElected counts each election it wins
  // (several managers on etcd).
  void SetLeader(bool leading);
  void OnElected();
  // A node the manager forgot: its series go.
  void ForgetNode(const std::string& node);
  // A job's counters and histograms, at 0 from its submission or the manager's recovery of it
  // (Note [Series from the start] in manager_metrics.cc). Idempotent.
  void AddJob(const std::string& job);
  // A job the manager no longer keeps (pruned by retention): its series go.
  void ForgetJob(const std::string& job);

  // Each node's speed relative to its peers in `job` (varuna_node_relative_speed); the job's
  // series of nodes not in `speeds` go.
  void SetNodeSpeeds(const std::string& job, const std::map<std::string, double>& speeds);

  // The reason label of a morph: its record's kind (lost | notice | drain | join | failed |
  // straggler | recovered), or for a record without one, guessed from its reason text.
  static std::string ReasonKind(const v1::MorphRecord& morph);

 private:
  prometheus::Family<prometheus::Gauge>& nodes_;
  prometheus::Family<prometheus::Gauge>& node_slots_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& job_step_;
  prometheus::Family<prometheus::Gauge>& job_loss_;
  prometheus::Family<prometheus::Gauge>& job_eval_loss_;
  prometheus::Family<prometheus::Gauge>& job_samples_;
  prometheus::Family<prometheus::Histogram>& job_step_seconds_;
  prometheus::Family<prometheus::Gauge>& job_bubble_;
  prometheus::Family<prometheus::Gauge>& job_mfu_;
  prometheus::Family<prometheus::Gauge>& job_slots_;
  prometheus::Family<prometheus::Gauge>& user_slots_;
  std::map<std::string, prometheus::Gauge*> user_gauges_;
  prometheus::Family<prometheus::Counter>& morphs_;
  prometheus::Family<prometheus::Histogram>& morph_phase_;
  prometheus::Family<prometheus::Histogram>& heartbeat_latency_;
  prometheus::Family<prometheus::Gauge>& node_speed_;
  prometheus::Family<prometheus::Gauge>& is_leader_;
  prometheus::Family<prometheus::Counter>& leader_changes_;
  std::map<std::string, std::set<std::string>> speed_nodes_;  // job -> nodes with a series
  // job -> (generation, step) of the step its gauges show (OnSteps).
  std::map<std::string, std::pair<int64_t, int64_t>> shown_step_;
  std::map<std::string, std::pair<int64_t, int64_t>> shown_eval_;  // ... its validation loss
  std::map<std::string, prometheus::Gauge*> slots_by_node_;
  std::map<std::string, prometheus::Histogram*> latency_by_node_;
  std::set<std::string> jobs_known_;
};

}  // namespace varuna

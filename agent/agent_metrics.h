#pragma once

// varuna-agent's metrics (docs/observability.md), updated by Agent in its transitions (launch,
// exit, notice) on its loop thread; GET /metrics renders them from an HTTP thread.

#include <string>

#include "common/net/metrics.h"

namespace varuna {

class AgentMetrics {
 public:
  AgentMetrics(MetricsRegistry& r, int slots);
  // A worker process started for (job, rank); a start after the first is a restart.
  void OnWorkerStarted(const std::string& job, bool restart);
  // A worker exited: by signal, non-zero code or cleanly.
  void OnWorkerExited(const std::string& job, int exit_code, int signal);
  // The job's series go (its directory was removed here): series per job do not pile up.
  void ForgetJob(const std::string& job);
  void SetWorkers(int running, int exited);
  void SetNotice(bool under_notice, double seconds_left);

 private:
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Counter>& starts_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& exits_;
  prometheus::Gauge& notice_;
  prometheus::Gauge& notice_left_;
};

}  // namespace varuna

#include "agent/agent_metrics.h"

namespace varuna {

AgentMetrics::AgentMetrics(MetricsRegistry& r, int slots)
    : workers_(r.Gauge("varuna_agent_workers", "Worker processes this agent holds, by state")),
      starts_(r.Counter("varuna_agent_worker_starts_total", "Worker processes started")),
      restarts_(r.Counter("varuna_agent_worker_restarts_total",
                          "Worker processes started again for a (job, rank) that ran here before")),
      exits_(r.Counter("varuna_agent_worker_exits_total", "Worker processes that ended, by how")),
      notice_(r.Gauge("varuna_agent_preemption_notice", "1 while this machine is under notice")
                  .Add({})),
      notice_left_(r.Gauge("varuna_agent_preemption_seconds_left",
                           "Seconds until the announced preemption (0 without a notice)")
                       .Add({})) {
  r.Gauge("varuna_agent_slots", "Worker slots this agent offers").Add({}).Set(slots);
  SetWorkers(0, 0);
}

void AgentMetrics::OnWorkerStarted(const std::string& job, bool restart) {
  starts_.Add({{"job", job}}).Increment();
  if (restart) restarts_.Add({{"job", job}}).Increment();
}

void AgentMetrics::OnWorkerExited(const std::string& job, int exit_code, int signal) {
  const char* how = signal != 0 ? "signal" : exit_code == 0 ? "ok" : "error";
  exits_.Add({{"job", job}, {"how", how}}).Increment();
}

void AgentMetrics::ForgetJob(const std::string& job) {
  const prometheus::Labels of_job = {{"job", job}};
  if (starts_.Has(of_job)) starts_.Remove(&starts_.Add(of_job));
  if (restarts_.Has(of_job)) restarts_.Remove(&restarts_.Add(of_job));
  for (const char* how : {"signal", "ok", "error"}) {
    const prometheus::Labels labels = {{"job", job}, {"how", how}};
    if (exits_.Has(labels)) exits_.Remove(&exits_.Add(labels));
  }
}

void AgentMetrics::SetWorkers(int running, int exited) {
  workers_.Add({{"state", "running"}}).Set(running);
  workers_.Add({{"state", "exited"}}).Set(exited);
}

void AgentMetrics::SetNotice(bool under_notice, double seconds_left) {
  notice_.Set(under_notice ? 1 : 0);
  notice_left_.Set(under_notice ? std::max(0.0, seconds_left) : 0);
}

}  // namespace varuna

#pragma once

// The metrics registry shared by varuna-manager and varuna-agent (docs/observability.md).
//
// One prometheus-cpp registry per daemon, created in main() and injected into the objects
// whose state transitions update it (Manager, Agent). Families are created up front by the
// typed metric sets (manager/state/manager_metrics.h, agent/agent_metrics.h); `Text()` renders the
// Prometheus text exposition format for GET /metrics.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace varuna {

class MetricsRegistry {
 public:
  MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}
  prometheus::Family<prometheus::Gauge>& Gauge(const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Counter>& Counter(const std::string& name,
                                                   const std::string& help);
  prometheus::Family<prometheus::Histogram>& Histogram(const std::string& name,
                                                       const std::string& help);
  // The text exposition format (version 0.0.4) of every metric.
  std::string Text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

// Sets gauge family `f` to `counts` (label value -> count) under label `label`, zeroing label
// values seen before but absent now (so a state that empties reads 0, not its last count).
void SetCounts(prometheus::Family<prometheus::Gauge>& f, const std::string& label,
               const std::map<std::string, double>& counts, std::vector<std::string> all = {});

// Exponential histogram bucket bounds: `first`, first*factor, ... (`count` bounds).
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double first, double factor, int count);

}  // namespace varuna

#include "common/net/metrics.h"

#include <prometheus/text_serializer.h>

namespace varuna {

prometheus::Family<prometheus::Gauge>& MetricsRegistry::Gauge(const std::string& name,
                                                              const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
}

prometheus::Family<prometheus::Counter>& MetricsRegistry::Counter(const std::string& name,
                                                                  const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
}

prometheus::Family<prometheus::Histogram>& MetricsRegistry::Histogram(const std::string& name,
                                                                      const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
}

std::string MetricsRegistry::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void SetCounts(prometheus::Family<prometheus::Gauge>& f, const std::string& label,
               const std::map<std::string, double>& counts, std::vector<std::string> all) {
  for (const auto& [value, n] : counts) all.push_back(value);
  for (const std::string& value : all) {
    auto it = counts.find(value);
    f.Add({{label, value}}).Set(it == counts.end() ? 0.0 : it->second);
  }
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double first, double factor, int count) {
  prometheus::Histogram::BucketBoundaries b;
  double v = first;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

}  // namespace varuna

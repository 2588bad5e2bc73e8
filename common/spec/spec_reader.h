#pragma once

// The job spec's reading helpers, shared by its sections' parsers (job_spec.cc, data_spec.cc):
// a mapping walker that refuses unknown and repeated keys, and range checks whose errors name
// the key ("job spec: 'train.lr' is -1; must be a finite number in [0, 100]").

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace spec_detail {

inline absl::Status Bad(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: '", key, "' ", what));
}

// Walks one YAML mapping, dispatching each key to a field reader; unknown keys, keys that
// are not plain names and keys given twice are errors (ForEachEntry).
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string prefix) : node_(node), prefix_(std::move(prefix)) {}

  template <typename T>
  MapReader& Field(const std::string& key, T* out) {
    readers_[key] = [this, key, out](const YAML::Node& v) -> absl::Status {
      if constexpr (std::is_same_v<T, std::string>) {
        auto s = YamlScalar(v, "job spec", Path(key));
        if (!s.ok()) return s.status();
        *out = *std::move(s);
      } else {
        auto r = YamlAs<T>(v, "job spec", Path(key));
        if (!r.ok()) return r.status();
        *out = *std::move(r);
      }
      return absl::OkStatus();
    };
    return *this;
  }
  MapReader& Sub(const std::string& key, std::function<absl::Status(const YAML::Node&)> fn) {
    readers_[key] = std::move(fn);
    return *this;
  }

  absl::Status Read() {
    if (!node_ || node_.IsNull()) return absl::OkStatus();
    return ForEachEntry(node_, "job spec", prefix_,
                        [&](const std::string& key, const YAML::Node& value) -> absl::Status {
                          auto it = readers_.find(key);
                          if (it == readers_.end()) {
                            std::vector<std::string> known;
                            for (const auto& [k, _] : readers_) known.push_back(k);
                            return absl::InvalidArgumentError(
                                absl::StrCat("job spec: unknown key '", Path(key),
                                             "' (known: ", absl::StrJoin(known, ", "), ")"));
                          }
                          return it->second(value);
                        });
  }

  std::string Path(const std::string& key) const {
    return prefix_.empty() ? key : absl::StrCat(prefix_, ".", key);
  }

 private:
  const YAML::Node node_;  // a handle (copying shares the node)
  std::string prefix_;
  std::map<std::string, std::function<absl::Status(const YAML::Node&)>> readers_;
};

inline absl::Status OneOf(const std::string& key, const std::string& value,
                          const std::set<std::string>& allowed) {
  if (allowed.count(value)) return absl::OkStatus();
  return Bad(key,
             absl::StrCat("is '", value, "'; expected one of: ", absl::StrJoin(allowed, ", ")));
}

template <typename T>
absl::Status InRange(const std::string& key, T value, int64_t lo, int64_t hi) {
  if (static_cast<int64_t>(value) >= lo && static_cast<int64_t>(value) <= hi) {
    return absl::OkStatus();
  }
  return Bad(key, absl::StrCat("is ", value, "; must be in [", lo, ", ", hi, "]"));
}

inline absl::Status Finite(const std::string& key, double value, double lo, double hi,
                           bool open_low = false) {
  const bool ok = std::isfinite(value) && (open_low ? value > lo : value >= lo) && value <= hi;
  if (ok) return absl::OkStatus();
  return Bad(key, absl::StrCat("is ", value, "; must be a finite number in ", open_low ? "(" : "[",
                               lo, ", ", hi, "]"));
}

}  // namespace spec_detail
}  // namespace varuna

#pragma once

// The one way outside YAML/JSON text becomes values (job specs, config files, checkpoint
// metadata, progress files): every yaml-cpp exception stays inside these functions and comes
// out as a Status naming the key. Mapping keys must be plain scalars and unique; numbers are
// checked for range and finiteness by the callers' Validate().

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace varuna {

// Parses one YAML (or JSON) document. `what` prefixes the error ("job spec", a path, ...).
absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& what);

// Calls fn(key, value) for each entry of `map` in document order. Errors: `map` is not a
// mapping, a key that is not a plain scalar (`? [a, b]`), or a key given twice.
// `where` is the key path of `map` for messages ("" for the root).
absl::Status ForEachEntry(
    const YAML::Node& map, const std::string& what, const std::string& where,
    const std::function<absl::Status(const std::string&, const YAML::Node&)>& fn);

// A daemon's YAML config file: read as a regular file of at most 1 MiB, parsed, and each
// top-level entry passed to fn(key, value) (ForEachEntry's rules). `what` is e.g.
// "agent config": errors read "agent config PATH: ...". An empty file is OK.
absl::Status ForEachConfigEntry(
    const std::string& path, const std::string& what,
    const std::function<absl::Status(const std::string& where, const std::string& key,
                                     const YAML::Node& value)>& fn);

// The value's text for messages: the scalar, or a flow rendering clipped to 80 characters.
std::string Describe(const YAML::Node& v);

// v.as<T>() without exceptions; InvalidArgument "<what>: '<key>' has an invalid value 'x'".
template <typename T>
absl::StatusOr<T> YamlAs(const YAML::Node& v, const std::string& what, const std::string& key) {
  try {
    if (!v.IsDefined() || v.IsNull()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", key, "' is missing"));
    }
    return v.as<T>();
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", key, "' has an invalid value '", Describe(v), "'"));
  }
}

// A scalar string (a list or mapping is an error, not an empty string).
absl::StatusOr<std::string> YamlScalar(const YAML::Node& v, const std::string& what,
                                       const std::string& key);

// *out = the value (strings must be scalars); the error names `key` in `what`.
template <typename T>
absl::Status ReadInto(const YAML::Node& v, const std::string& what, const std::string& key,
                      T* out) {
  if constexpr (std::is_same_v<T, std::string>) {
    auto r = YamlScalar(v, what, key);
    if (!r.ok()) return r.status();
    *out = *std::move(r);
  } else {
    auto r = YamlAs<T>(v, what, key);
    if (!r.ok()) return r.status();
    *out = *std::move(r);
  }
  return absl::OkStatus();
}

// A duration given in seconds: finite, >= 0 and at most a week.
absl::Status ReadSeconds(const YAML::Node& v, const std::string& what, const std::string& key,
                         absl::Duration* out);

}  // namespace varuna

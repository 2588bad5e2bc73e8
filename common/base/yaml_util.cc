#include "common/base/yaml_util.h"

#include <cmath>
#include <set>
#include <sstream>

#include "common/base/safe_file.h"

namespace varuna {

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& what) {
  try {
    return YAML::Load(text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed YAML: ", e.what()));
  }
}

std::string Describe(const YAML::Node& v) {
  try {
    if (v.IsScalar()) return v.Scalar().size() > 80 ? v.Scalar().substr(0, 80) + "..." : v.Scalar();
    YAML::Emitter e;
    e.SetMapFormat(YAML::Flow);
    e.SetSeqFormat(YAML::Flow);
    e << v;
    std::string s = e.c_str();
    return s.size() > 80 ? s.substr(0, 80) + "..." : s;
  } catch (const std::exception&) {
    return "<unprintable>";
  }
}

absl::Status ForEachEntry(
    const YAML::Node& map, const std::string& what, const std::string& where,
    const std::function<absl::Status(const std::string&, const YAML::Node&)>& fn) {
  const std::string here = where.empty() ? "<root>" : where;
  if (!map.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", here, "' must be a mapping"));
  }
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": a key in '", here, "' is not a plain name: '", Describe(kv.first), "'"));
    }
    const std::string key = kv.first.Scalar();
    const std::string path = where.empty() ? key : absl::StrCat(where, ".", key);
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", path, "' is given twice"));
    }
    absl::Status s = fn(key, kv.second);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ForEachConfigEntry(
    const std::string& path, const std::string& what,
    const std::function<absl::Status(const std::string& where, const std::string& key,
                                     const YAML::Node& value)>& fn) {
  auto text = ReadRegularFile(path, 1 << 20, what);
  if (!text.ok()) return text.status();
  const std::string where = absl::StrCat(what, " ", path);
  auto loaded = ParseYaml(*text, where);
  if (!loaded.ok()) return loaded.status();
  const YAML::Node root = *loaded;
  if (!root || root.IsNull()) return absl::OkStatus();
  try {  // Note [Parser boundary] (common/spec/submission.cc).
    return ForEachEntry(root, where, "", [&](const std::string& key, const YAML::Node& v) {
      return fn(where, key, v);
    });
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": cannot be read: ", e.what()));
  }
}

absl::StatusOr<std::string> YamlScalar(const YAML::Node& v, const std::string& what,
                                       const std::string& key) {
  if (!v.IsDefined())
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", key, "' is missing"));
  if (v.IsNull()) return std::string();
  if (!v.IsScalar()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", key, "' must be a single value, not '", Describe(v), "'"));
  }
  return v.Scalar();
}

absl::Status ReadSeconds(const YAML::Node& v, const std::string& what, const std::string& key,
                         absl::Duration* out) {
  auto r = YamlAs<double>(v, what, key);
  if (!r.ok()) return r.status();
  if (!std::isfinite(*r) || *r < 0 || *r > 7 * 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", key, "' is ", *r, "; must be seconds in [0, 604800]"));
  }
  *out = absl::Seconds(*r);
  return absl::OkStatus();
}

}  // namespace varuna

#include "common/base/yaml_util.h"

#include <cmath>
#include <set>
#include <sstream>
#include <vector>

#include "common/base/safe_file.h"

namespace varuna {

namespace {

// Note [Alias bombs]: yaml-cpp loads an alias as a reference to its anchored node, so a small
// document can stand for an exponentially large tree (a list of aliases of lists of
// aliases...); every reader then walks the expansion (a 40 KB job spec once expanded to 10^7
// module names and froze the manager). ParseYaml walks the expansion once, counting nodes and
// scalar bytes as a reader would meet them, and refuses the document as soon as either passes
// a budget proportional to its own size: no honest document exceeds it, with or without
// anchors, and the walk stops at the budget.
absl::Status CheckExpansion(const YAML::Node& root, size_t text_bytes, const std::string& what) {
  const int64_t max_nodes = 4 * static_cast<int64_t>(text_bytes) + 1024;
  const int64_t max_bytes = 4 * static_cast<int64_t>(text_bytes) + (64 << 10);
  int64_t nodes = 0, bytes = 0;
  std::vector<YAML::Node> pending{root};
  auto too_big = [&](const char* of) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the document expands (through its aliases) to more ", of, " than its ", text_bytes,
        " bytes can hold; refused (write the values out, or use fewer aliases)"));
  };
  while (!pending.empty()) {
    const YAML::Node n = pending.back();
    pending.pop_back();
    if (++nodes > max_nodes) return too_big("nodes");
    switch (n.Type()) {
      case YAML::NodeType::Scalar:
        bytes += static_cast<int64_t>(n.Scalar().size());
        if (bytes > max_bytes) return too_big("text");
        break;
      case YAML::NodeType::Sequence:
        for (const YAML::Node& child : n) {
          pending.push_back(child);
          if (static_cast<int64_t>(pending.size()) + nodes > max_nodes) return too_big("nodes");
        }
        break;
      case YAML::NodeType::Map:
        for (const auto& kv : n) {
          pending.push_back(kv.first);
          pending.push_back(kv.second);
          if (static_cast<int64_t>(pending.size()) + nodes > max_nodes) return too_big("nodes");
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& what) {
  try {
    YAML::Node root = YAML::Load(text);
    if (absl::Status s = CheckExpansion(root, text.size(), what); !s.ok()) return s;
    return root;
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

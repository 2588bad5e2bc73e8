#include "common/checkpoint/hf_weights.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/json_text.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {

absl::StatusOr<HfWeights> HfWeights::Open(const std::string& dir) {
  HfWeights w;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (!CheckRegularFile(index_path, "index").ok()) {
    ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::Open(dir + "/model.safetensors"));
    w.shards_.push_back(std::make_shared<SafetensorsReader>(std::move(r)));
    return w;
  }
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(index_path, 64 << 20, "safetensors index"));
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, index_path));
  if (!root.IsMap() || !root["weight_map"] || !root["weight_map"].IsMap()) {
    return absl::DataLossError(absl::StrCat(index_path, ": no weight_map object"));
  }
  std::map<std::string, std::string> weight_map;
  RETURN_IF_ERROR(ForEachEntry(root["weight_map"], index_path, "weight_map",
                               [&](const std::string& name, const YAML::Node& v) -> absl::Status {
                                 ASSIGN_OR_RETURN(weight_map[name],
                                                  YamlScalar(v, index_path, "weight_map." + name));
                                 return absl::OkStatus();
                               }));
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file);
  std::set<std::string> seen;
  for (const std::string& file : files) {
    if (file.find('/') != std::string::npos || file == ".." || file == ".") {
      return absl::DataLossError(
          absl::StrCat(index_path, ": shard '", file, "' is not a file of the directory"));
    }
    ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::Open(dir + "/" + file));
    for (const SafetensorsEntry& e : r.tensors()) {
      if (!seen.insert(e.name).second) {
        return absl::DataLossError(absl::StrCat(dir, ": tensor '", e.name, "' is in two shards"));
      }
      auto it = weight_map.find(e.name);
      if (it == weight_map.end() || it->second != file) {
        return absl::DataLossError(absl::StrCat(index_path, ": tensor '", e.name, "' is in ", file,
                                                " but the index says ",
                                                it == weight_map.end() ? "nothing" : it->second));
      }
    }
    w.shards_.push_back(std::make_shared<SafetensorsReader>(std::move(r)));
  }
  for (const auto& [name, file] : weight_map) {
    if (!seen.count(name)) {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor '", name, "' is mapped to ",
                                              file, ", which lacks it"));
    }
  }
  return w;
}

const SafetensorsEntry* HfWeights::Find(const std::string& name,
                                        const SafetensorsReader** shard) const {
  for (const auto& r : shards_) {
    if (const SafetensorsEntry* e = r->Find(name)) {
      *shard = r.get();
      return e;
    }
  }
  return nullptr;
}

std::vector<std::string> HfWeights::Names() const {
  std::set<std::string> names;
  for (const auto& r : shards_) {
    for (const SafetensorsEntry& e : r->tensors()) names.insert(e.name);
  }
  return {names.begin(), names.end()};
}

std::string HfIndexJson(uint64_t total_size,
                        const std::vector<std::pair<std::string, std::string>>& weight_map) {
  std::string out = absl::StrCat("{\n  \"metadata\": {\n    \"total_size\": ", total_size,
                                 "\n  },\n  \"weight_map\": {\n");
  for (size_t i = 0; i < weight_map.size(); ++i) {
    out += "    ";
    AppendJsonString(&out, weight_map[i].first);
    out += ": ";
    AppendJsonString(&out, weight_map[i].second);
    out += i + 1 < weight_map.size() ? ",\n" : "\n";
  }
  return out + "  }\n}\n";
}

}  // namespace varuna

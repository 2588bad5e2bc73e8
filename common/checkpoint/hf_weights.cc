#include "common/checkpoint/hf_weights.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/json_text.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {

// Note [Files of a model directory]: a model directory is the user's, and the tools that read
// it may run as root (varuna-ckpt as an admin). Hugging Face's own cache is made of links
// (snapshots/REV/model.safetensors -> ../../blobs/SHA), so links are followed, but only to
// files beneath the directory, or beneath the cached repository for a snapshot: the file
// actually opened (/proc/self/fd) is checked, not the name, so a link swapped in between
// cannot lead elsewhere, and a shard or tokenizer file linked to /etc/shadow is refused.
absl::StatusOr<int> OpenModelFile(const std::string& dir, const std::string& name,
                                  const std::string& what) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", name, "' is not a file of the directory ", dir));
  }
  std::filesystem::path root(dir);
  if (root.has_parent_path() && root.parent_path().filename() == "snapshots") {
    root = root.parent_path().parent_path();
  }
  std::error_code ec;
  const std::filesystem::path real_root = std::filesystem::canonical(root, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(what, ": ", dir, ": ", ec.message()));
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(absl::StrCat(dir, "/", name), what));
  const std::filesystem::path opened =
      std::filesystem::read_symlink(absl::StrCat("/proc/self/fd/", fd), ec);
  if (ec || !absl::StartsWith(opened.string(), real_root.string() + "/")) {
    ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        what, " '", name, "' of ", dir, " links outside ", real_root.string(), ": refused"));
  }
  return fd;
}

namespace {

// The reader of the model file `name` of `dir` (OpenModelFile), through the descriptor it
// checked.
absl::StatusOr<SafetensorsReader> OpenShard(const std::string& dir, const std::string& name) {
  ASSIGN_OR_RETURN(const int fd, OpenModelFile(dir, name, "safetensors file"));
  absl::StatusOr<SafetensorsReader> r = SafetensorsReader::Open(absl::StrCat("/proc/self/fd/", fd));
  ::close(fd);
  if (!r.ok()) {
    const std::string fd_path = absl::StrCat("/proc/self/fd/", fd);
    std::string message(r.status().message());
    for (size_t at; (at = message.find(fd_path)) != std::string::npos;) {
      message.replace(at, fd_path.size(), absl::StrCat(dir, "/", name));
    }
    return absl::Status(r.status().code(), message);
  }
  r->set_path(absl::StrCat(dir, "/", name));
  return r;
}

}  // namespace

absl::StatusOr<HfWeights> HfWeights::Open(const std::string& dir) {
  HfWeights w;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (!CheckRegularFile(index_path, "index").ok()) {
    ASSIGN_OR_RETURN(SafetensorsReader r, OpenShard(dir, "model.safetensors"));
    w.shards_.push_back(std::make_shared<SafetensorsReader>(std::move(r)));
    return w;
  }
  ASSIGN_OR_RETURN(const int index_fd, OpenModelFile(dir, "model.safetensors.index.json", "index"));
  absl::StatusOr<std::string> read =
      ReadRegularFile(absl::StrCat("/proc/self/fd/", index_fd), 64 << 20, "safetensors index");
  ::close(index_fd);
  ASSIGN_OR_RETURN(std::string text, std::move(read));
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
    ASSIGN_OR_RETURN(SafetensorsReader r, OpenShard(dir, file));
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

#include "common/spec/data_spec.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/data/manifest.h"
#include "common/spec/spec_reader.h"

namespace varuna {
namespace {

using spec_detail::Bad;
using spec_detail::Finite;
using spec_detail::MapReader;
using spec_detail::OneOf;

// KEY.sources: a list of {shards: [...], weight: W}.
absl::Status ReadSources(const YAML::Node& v, const std::string& base,
                         std::vector<DataSource>* out) {
  if (!v.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: '", base, ".sources' must be a list of {shards, weight}"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string key = absl::StrCat(base, ".sources[", i, "]");
    DataSource src;
    RETURN_IF_ERROR(ForEachEntry(
        v[i], "job spec", key, [&](const std::string& k, const YAML::Node& f) -> absl::Status {
          if (k == "weight") return ReadInto(f, "job spec", key + ".weight", &src.weight);
          if (k != "shards") {
            return absl::InvalidArgumentError(
                absl::StrCat("job spec: unknown key '", key, ".", k, "' (known: shards, weight)"));
          }
          const std::vector<YAML::Node> items = f.IsSequence()
                                                    ? std::vector<YAML::Node>(f.begin(), f.end())
                                                    : std::vector<YAML::Node>{f};
          for (const YAML::Node& item : items) {
            ASSIGN_OR_RETURN(std::string path, YamlScalar(item, "job spec", key + ".shards"));
            src.shards.push_back(std::move(path));
          }
          return absl::OkStatus();
        }));
    out->push_back(std::move(src));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> DataSpec::AllShards() const {
  std::vector<std::string> out;
  for (const DataSource& s : sources) out.insert(out.end(), s.shards.begin(), s.shards.end());
  return out;
}

absl::Status ReadDataSpec(const YAML::Node& node, const std::string& key, DataSpec* out) {
  MapReader r(node, key);
  r.Field("kind", &out->kind)
      .Field("path", &out->path)
      .Field("dtype", &out->dtype)
      .Field("eod_token", &out->eod_token)
      .Field("sample_log", &out->sample_log)
      .Field("tokenizer_dir", &out->tokenizer_dir)
      .Sub("sources",
           [out, key](const YAML::Node& v) { return ReadSources(v, key, &out->sources); });
  return r.Read();
}

absl::Status ValidateDataSpec(const DataSpec& data, int64_t vocab, const std::string& key) {
  const std::string k = key + ".";
  RETURN_IF_ERROR(OneOf(k + "kind", data.kind, {"text", "tokens", "indexed", "llmc"}));
  if (!data.corpus()) {
    if (data.path.empty()) return Bad(k + "path", "is required");
    if (!data.sources.empty()) {
      return Bad(k + "sources", absl::StrCat("is for kind indexed or llmc, not ", data.kind));
    }
    return OneOf(k + "dtype", data.dtype, {"uint16", "uint32"});
  }
  if (!data.path.empty()) {
    return Bad(k + "path", absl::StrCat("is not used with kind ", data.kind,
                                        ": list the shards under ", k, "sources"));
  }
  if (data.sources.empty()) return Bad(k + "sources", "is required for kind " + data.kind);
  if (data.sources.size() > 1024) return Bad(k + "sources", "has more than 1024 sources");
  double sum = 0;
  for (size_t i = 0; i < data.sources.size(); ++i) {
    const DataSource& s = data.sources[i];
    const std::string src = absl::StrCat(k, "sources[", i, "]");
    if (s.shards.empty()) return Bad(src + ".shards", "is empty");
    for (const std::string& shard : s.shards) {
      if (shard.empty()) return Bad(src + ".shards", "has an empty path");
    }
    RETURN_IF_ERROR(Finite(src + ".weight", s.weight, 0, 1e9));
    sum += s.weight;
  }
  if (!(sum > 0)) return Bad(k + "sources", "weights sum to zero: no source would be read");
  if (data.eod_token >= vocab) {
    return Bad(k + "eod_token", absl::StrCat("is ", data.eod_token, "; model.vocab is ", vocab));
  }
  return absl::OkStatus();
}

absl::Status ValidateDataFiles(const DataSpec& data, int64_t vocab, const std::string& key) {
  const std::string k = key + ".";
  if (!data.corpus()) RETURN_IF_ERROR(CheckRegularFile(data.path, k + "path"));
  for (const std::string& shard : data.AllShards()) {
    if (data.kind == "indexed") {
      RETURN_IF_ERROR(CheckRegularFile(shard + ".idx", k + "sources shard"));
      RETURN_IF_ERROR(CheckRegularFile(shard + ".bin", k + "sources shard"));
    } else {
      RETURN_IF_ERROR(CheckRegularFile(shard, k + "sources shard"));
    }
  }
  if (!data.tokenizer_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(data.tokenizer_dir, ec)) {
      return Bad(k + "tokenizer_dir",
                 absl::StrCat("'", data.tokenizer_dir, "' is not a directory"));
    }
  }
  if (data.corpus()) {
    // The manifests varuna-data wrote: the same tokenizer, a vocabulary that fits the model.
    RETURN_IF_ERROR(
        CheckManifests(data.AllShards(), vocab, data.eod_token, data.tokenizer_dir).status());
  }
  return absl::OkStatus();
}

}  // namespace varuna

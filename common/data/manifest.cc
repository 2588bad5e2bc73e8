#include "common/data/manifest.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/safe_file.h"
#include "common/base/sha256.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {

std::string ManifestPath(const std::string& shard) {
  if (absl::EndsWith(shard, ".bin")) {
    return absl::StrCat(shard.substr(0, shard.size() - 4), ".manifest.json");
  }
  return absl::StrCat(shard, ".manifest.json");
}

absl::StatusOr<std::optional<Manifest>> ReadManifest(const std::string& shard) {
  const std::string path = ManifestPath(shard);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<Manifest>();
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, 1 << 20, "data manifest"));
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, path));
  Manifest m;
  m.path = path;
  bool saw_vocab = false;
  RETURN_IF_ERROR(ForEachEntry(
      root, path, "", [&](const std::string& key, const YAML::Node& v) -> absl::Status {
        if (key == "tokens") return ReadInto(v, path, key, &m.tokens);
        if (key == "documents") return ReadInto(v, path, key, &m.documents);
        if (key == "vocab_size") {
          saw_vocab = true;
          return ReadInto(v, path, key, &m.vocab_size);
        }
        if (key == "eod_token") return ReadInto(v, path, key, &m.eod_token);
        if (key == "tokenizer_sha256") return ReadInto(v, path, key, &m.tokenizer_sha256);
        return absl::OkStatus();  // other fields (format, tokenizer, inputs, ...) are notes
      }));
  if (!saw_vocab || m.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no vocab_size"));
  }
  return std::optional<Manifest>(std::move(m));
}

absl::StatusOr<std::string> TokenizerSha256(const std::string& tokenizer_dir) {
  return Sha256OfFile((std::filesystem::path(tokenizer_dir) / "tokenizer.json").string());
}

absl::StatusOr<int64_t> CheckManifests(const std::vector<std::string>& shards, int64_t vocab,
                                       int64_t eod_token, const std::string& tokenizer_dir) {
  std::string tokenizer;
  if (!tokenizer_dir.empty()) {
    ASSIGN_OR_RETURN(tokenizer, TokenizerSha256(tokenizer_dir));
  }
  int64_t eod = eod_token;
  std::string eod_from = eod_token >= 0 ? "data.eod_token" : "";
  for (const std::string& shard : shards) {
    ASSIGN_OR_RETURN(std::optional<Manifest> m, ReadManifest(shard));
    if (!m) continue;
    if (m->vocab_size > vocab) {
      return absl::InvalidArgumentError(absl::StrCat(m->path, ": vocab_size ", m->vocab_size,
                                                     " is larger than model.vocab ", vocab));
    }
    if (!tokenizer.empty() && !m->tokenizer_sha256.empty() && m->tokenizer_sha256 != tokenizer) {
      return absl::InvalidArgumentError(
          absl::StrCat(m->path, ": made with another tokenizer (tokenizer.json sha256 ",
                       m->tokenizer_sha256.substr(0, 12), "...) than data.tokenizer_dir ",
                       tokenizer_dir, " (", tokenizer.substr(0, 12), "...)"));
    }
    if (m->eod_token < 0) continue;
    if (eod >= 0 && m->eod_token != eod) {
      return absl::InvalidArgumentError(
          absl::StrCat(m->path, ": eod_token ", m->eod_token, " but ", eod_from, " says ", eod));
    }
    if (eod < 0) eod_from = m->path;
    eod = m->eod_token;
  }
  if (eod >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(eod_from, ": end-of-document token ", eod,
                                                   " is not below model.vocab ", vocab));
  }
  return eod;
}

}  // namespace varuna

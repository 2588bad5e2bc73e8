#pragma once

// What varuna-data prepare writes beside a shard (docs/data.md "Preparing data"):
// PREFIX.manifest.json with the tokens, documents, vocab_size, eod_token and the sha256 of
// the tokenizer.json that made them. A job's data.tokenizer_dir, model vocabulary and
// end-of-document token are checked against it (varunactl submit, and the worker). No
// LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

struct Manifest {
  std::string path;
  int64_t tokens = 0, documents = 0, vocab_size = 0, eod_token = -1;
  std::string tokenizer_sha256;
};

// The manifest of a shard: PREFIX.manifest.json for a Megatron prefix, and for an llm.c file
// the same name with .manifest.json in place of its .bin (FILE.manifest.json otherwise).
std::string ManifestPath(const std::string& shard);
// The shard's manifest, or nullopt when there is none; a manifest that does not parse or
// lacks a field is an error naming it.
absl::StatusOr<std::optional<Manifest>> ReadManifest(const std::string& shard);
// Hex sha256 of DIR/tokenizer.json.
absl::StatusOr<std::string> TokenizerSha256(const std::string& tokenizer_dir);

// Checks the manifests of `shards` against the job: every vocab_size <= vocab, one
// end-of-document token (and `eod_token`, when >= 0, equal to it), and with a tokenizer_dir,
// the same tokenizer (a shard without a manifest is not checked). Returns the end-of-document
// token: `eod_token` if >= 0, else the manifests', else -1.
absl::StatusOr<int64_t> CheckManifests(const std::vector<std::string>& shards, int64_t vocab,
                                       int64_t eod_token, const std::string& tokenizer_dir);

}  // namespace varuna

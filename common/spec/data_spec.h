#pragma once

// The job spec's data sections: `data` (what the job trains on) and `eval.data` (what its
// validation loss is computed on), one form for both (docs/data.md).

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace varuna {

// One weighted source of a corpus (docs/data.md "Corpora"): its shards are read end to end.
struct DataSource {
  std::vector<std::string> shards;  // Megatron prefixes (kind indexed) or llm.c files (llmc)
  double weight = 1;
};

struct DataSpec {
  // text (bytes of a file, vocab >= 256) | tokens (flat binary) | indexed (Megatron
  // PREFIX.bin/.idx shards) | llmc (llm.c token files); the last two read `sources`.
  std::string kind = "text";
  std::string path;                 // text and tokens
  std::string dtype = "uint16";     // tokens only: uint16 | uint32
  std::vector<DataSource> sources;  // indexed and llmc (Note [Sample stream] in corpus.h)
  int64_t eod_token = -1;  // the end-of-document token; -1: the shards' manifests' (if any)
  // When set, the rank that feeds a sample into its pipeline appends one JSON line per
  // sample to DIR/rank-R.gen-G.jsonl when the step commits (indexed and llmc).
  std::string sample_log;
  // The Hugging Face tokenizer that made the tokens (tokenizer.json, ...): checked against the
  // shards' manifests; varuna-ckpt export copies its files next to the weights.
  std::string tokenizer_dir;
  bool corpus() const { return kind == "indexed" || kind == "llmc"; }
  // Every shard of every source, in order.
  std::vector<std::string> AllShards() const;
};

// Reads a data mapping at `key` ("data", "eval.data") into `out`; unknown keys are errors
// naming their path.
absl::Status ReadDataSpec(const YAML::Node& node, const std::string& key, DataSpec* out);
// The section's own rules (a path or sources by kind, weights, eod_token below `vocab`);
// errors name `key`'s fields. Touches no file.
absl::Status ValidateDataSpec(const DataSpec& data, int64_t vocab, const std::string& key);
// Its files: the path or every shard readable, tokenizer_dir a directory, the shards'
// manifests agreeing with the model and the tokenizer.
absl::Status ValidateDataFiles(const DataSpec& data, int64_t vocab, const std::string& key);

}  // namespace varuna

#pragma once

// A corpus: weighted sources of token shards, read as a stream of training samples (docs/data.md
// "Corpora"). No LibTorch.
//
// Note [Sample stream]: a source's tokens are its shards' laid end to end (documents carry
// their end-of-document token as written: Megatron's preprocessing and varuna-data append it,
// llm.c's files put it before each document); its samples are windows of seq_len + 1 tokens
// at multiples of seq_len, as Megatron's GPT dataset cuts them, and the tail that fills no
// sample is dropped. A source's epoch is each of its samples once, in an order shuffled from
// (seed, source, epoch) by a keyed permutation (no table: any position is found in O(1)).
// Blending is Megatron's: each next sample comes from the source furthest behind its weight
// (weight x max(n, 1) - taken, the first on ties), so the whole stream is one deterministic
// sequence, and where it stands is a StreamPosition: the samples taken from each source. A
// step's samples are the next global_batch of the stream, whatever P x D is; the position is
// saved with the step, so a morph or a resume neither loses nor repeats a sample.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/token_shard.h"

namespace varuna {

struct CorpusSource {
  std::vector<std::string> shards;  // Megatron prefixes (kind indexed) or llm.c files (llmc)
  double weight = 1;
};

struct CorpusOptions {
  std::string kind = "indexed";  // indexed | llmc
  std::vector<CorpusSource> sources;
  int seq_len = 0;
  int64_t vocab = 0;  // every token read must be below it
  uint64_t seed = 0;
};

// Samples taken from each source since the start of training.
struct StreamPosition {
  std::vector<int64_t> taken;
  int64_t total() const;
  bool operator==(const StreamPosition& o) const { return taken == o.taken; }
};

struct SampleRef {
  int source = 0;
  int64_t epoch = 0;   // of that source
  int64_t sample = 0;  // which window of the source: 0 .. samples(source) - 1
};

class Corpus {
 public:
  // Opens every shard (errors name the file): a source with no shards or too few tokens for one
  // sample, weights that are negative, not finite or sum to zero.
  static absl::StatusOr<std::unique_ptr<Corpus>> Open(const CorpusOptions& options);

  int num_sources() const { return static_cast<int>(sources_.size()); }
  int64_t samples(int source) const;  // per epoch
  int64_t tokens(int source) const;
  StreamPosition Start() const;
  // The next `count` samples of the stream from *pos, which moves past them.
  std::vector<SampleRef> Next(StreamPosition* pos, int64_t count) const;
  // Moves *pos past the next `count` samples (O(count x sources)).
  void Advance(StreamPosition* pos, int64_t count) const;
  // Where the stream stands after `samples` samples from the start.
  StreamPosition PositionAt(int64_t samples) const;
  // 16 hex digits identifying the stream: kind, seq_len, seed, and each source's weight,
  // tokens and shard file names (not their folders: a corpus may move).
  std::string Fingerprint() const;
  // The seq_len + 1 tokens of a sample into out; an error names the shard of a token that is
  // negative or not below vocab.
  absl::Status Tokens(const SampleRef& ref, int64_t* out) const;

 private:
  struct Source {
    std::vector<std::unique_ptr<TokenShard>> shards;
    std::vector<int64_t> shard_start;  // first token of each shard in the source
    int64_t tokens = 0, samples = 0;
    double weight = 0;
    std::vector<std::string> names;  // the shards' file names
  };
  explicit Corpus(CorpusOptions options) : options_(std::move(options)) {}
  int NextSource(const StreamPosition& pos) const;

  CorpusOptions options_;
  std::vector<Source> sources_;
};

// The position of `index` (< n) in a permutation of [0, n) keyed by `key`: a Feistel network
// over the next power of two, walked back into range. A bijection for every key and n.
int64_t PermutedIndex(uint64_t key, int64_t n, int64_t index);

}  // namespace varuna

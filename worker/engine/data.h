#pragma once

// Training data (ARCHITECTURE "Data"): optimizer step s (1-based) uses global samples
// [(s-1)*B, s*B) whatever P, D and the micro-batch size are, so every configuration (and a
// resumed run) sees the same data.
// - text and tokens: global sample i is the window of seq_len+1 tokens at an offset drawn from
//   hash(seed, i);
// - indexed and llmc corpora: global sample i is the i-th sample of the corpus's stream
//   (Note [Sample stream] in common/data/corpus.h): epochs, Megatron's blending.
// A masked language model (bert) reads seq_len tokens per sample and masks them:
// Note [Masking] in worker/engine/data.cc.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/corpus.h"
#include "common/spec/job_spec.h"
#include "worker/models/model.h"

namespace varuna {

class TokenDataset {
 public:
  // text/tokens: memory-maps spec.path; checks that the file holds at least seq_len+1 tokens,
  // that a tokens file's size is a multiple of its dtype and every token is < vocab.
  // indexed/llmc: opens every shard of spec.sources (Corpus::Open's checks); a token >= vocab
  // is an error when its sample is read.
  static absl::StatusOr<TokenDataset> Open(const DataSpec& spec, int seq_len, int vocab,
                                           uint64_t seed);
  TokenDataset(TokenDataset&& o) noexcept;
  TokenDataset& operator=(TokenDataset&&) = delete;
  ~TokenDataset();

  // Returns {input_ids, labels}, each int64 [count, seq_len], for global samples
  // [first, first + count). Masked: input_ids after masking, labels -100 where a position is
  // not predicted, and loss_tokens [count], each sample's predicted positions.
  absl::StatusOr<TensorMap> Batch(int64_t first, int64_t count) const;
  // Masked language modelling from now on, with `mask_token` ([MASK]) and ids below `vocab`.
  void set_masked_lm(int64_t mask_token, int vocab) {
    mask_token_ = mask_token;
    vocab_ = vocab;
  }
  bool masked_lm() const { return mask_token_ >= 0; }
  // Masked: the predicted positions of global samples [first, first + count) (the step's
  // loss is their mean: its denominator, known before the forward); else count x seq_len.
  int64_t LossTokens(int64_t first, int64_t count) const;

  bool corpus() const { return corpus_ != nullptr; }
  // Corpora: which samples global samples [first, first + count) are (for the sample log).
  std::vector<SampleRef> Refs(int64_t first, int64_t count) const;
  // Corpora: where the stream stands after `samples` global samples, with the corpus's
  // fingerprint, as one line of JSON (a checkpoint keeps it); "" for text and tokens.
  std::string PositionRecord(int64_t samples) const;
  // Corpora: takes a checkpoint's PositionRecord. An error when it was written for another
  // corpus (sources, weights or shards changed); otherwise the stream continues from it.
  absl::Status ResumeFrom(const std::string& record) const;

  int64_t num_tokens() const { return num_tokens_; }

 private:
  TokenDataset() = default;
  uint64_t Token(int64_t i) const;
  // The key of global sample `index` whose stream sample is `ref` (corpora; Note [Masking] in
  // worker/engine/data.cc).
  uint64_t MaskKey(int64_t index, const SampleRef* ref) const;
  // The stream position after `samples` samples, from the nearest known one at or before it
  // (the start, or one a previous call or ResumeFrom left).
  StreamPosition PositionAt(int64_t samples) const;

  const uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  int width_ = 1;  // bytes per token
  int64_t num_tokens_ = 0;
  int seq_len_ = 0;
  uint64_t seed_ = 0;
  int64_t mask_token_ = -1;  // masked LM when >= 0
  int vocab_ = 0;
  // Corpora.
  std::unique_ptr<Corpus> corpus_;
  struct Positions {
    std::mutex mu;
    std::map<int64_t, StreamPosition> known;  // samples -> position (a bounded cache)
  };
  std::unique_ptr<Positions> positions_;
};

}  // namespace varuna

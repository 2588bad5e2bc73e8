#pragma once

// Training data (ARCHITECTURE "Data"): a sample is identified by (seed, global sample index);
// optimizer step s (1-based) uses global samples [(s-1)*B, s*B) whatever P, D and the
// micro-batch size are, so every configuration (and a resumed run) sees the same data.
// Sample i is the window of seq_len+1 tokens at an offset drawn from hash(seed, i).

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/models/model.h"

namespace varuna {

class TokenDataset {
 public:
  // Memory-maps spec.path. Checks that the file holds at least seq_len+1 tokens, that a
  // tokens file's size is a multiple of its dtype and every token is < vocab.
  static absl::StatusOr<TokenDataset> Open(const DataSpec& spec, int seq_len, int vocab,
                                           uint64_t seed);
  TokenDataset(TokenDataset&& o) noexcept;
  TokenDataset& operator=(TokenDataset&&) = delete;
  ~TokenDataset();

  // Returns {input_ids, labels}, each int64 [count, seq_len], for global samples
  // [first, first + count).
  TensorMap Batch(int64_t first, int64_t count) const;

  int64_t num_tokens() const { return num_tokens_; }

 private:
  TokenDataset() = default;
  uint64_t Token(int64_t i) const;

  const uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  int width_ = 1;  // bytes per token
  int64_t num_tokens_ = 0;
  int seq_len_ = 0;
  uint64_t seed_ = 0;
};

}  // namespace varuna

#pragma once

// The small GPT and fixed batches the engine's thread-rank tests train (engine_test.cc,
// fault_matrix_test.cc): sample i of step s is the same on every shape, so any P x D split of
// the same global batch can be compared with one process.

#include <cstdint>

#include "worker/engine/varuna.h"
#include "worker/models/registry.h"

namespace varuna::testing {

constexpr int kTinySeqLen = 8;

inline ModelSpec TinyGptSpec(int heads = 2, double dropout = 0) {
  ModelSpec spec;
  spec.layers = 4;
  spec.d_model = 32;
  spec.heads = heads;
  spec.dropout = dropout;
  spec.seq_len = kTinySeqLen;
  spec.vocab = 64;
  return spec;
}

// Step `step`'s global batch of `n` samples.
inline TensorMap TinyBatch(int64_t step, int64_t n) {
  torch::manual_seed(1000 + step);
  auto ids = torch::randint(0, 64, {n, kTinySeqLen + 1}, torch::kLong);
  return {{"input_ids", ids.narrow(1, 0, kTinySeqLen).contiguous()},
          {"labels", ids.narrow(1, 1, kTinySeqLen).contiguous()}};
}

// Samples [start, start + len) of `m`.
inline TensorMap SliceBatch(const TensorMap& m, int64_t start, int64_t len) {
  TensorMap out;
  for (const auto& [k, t] : m) out[k] = t.narrow(0, start, len);
  return out;
}

}  // namespace varuna::testing

#pragma once

// Token shards, read in place (mmap; docs/data.md "Corpora"): Megatron's indexed datasets
// (PREFIX.bin + PREFIX.idx) and llm.c's token files (a 256 x int32 header, then the tokens).
// A shard is a sequence of token runs laid end to end (a Megatron sequence; an llm.c file is
// one run); its tokens are read by position in that concatenation. Every error names the
// file. No LibTorch.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

class TokenShard {
 public:
  // Megatron's MMapIndexedDataset, version 1: PREFIX.idx ("MMIDIDX\0\0", version, dtype code,
  // sequence and document counts, then sequence lengths, sequence byte offsets into
  // PREFIX.bin, document boundaries) and PREFIX.bin. Integer dtypes only. The index is
  // checked against both files: counts that do not fit the .idx, sequences past the end of
  // the .bin, document boundaries out of order.
  static absl::StatusOr<std::unique_ptr<TokenShard>> OpenIndexed(const std::string& prefix);
  // llm.c's token file: header[0] = 20240520 with header[1] = 1 (uint16 tokens) or 20240801
  // with header[1] = 7 (uint32), header[2] = the token count; the file is exactly the header
  // and the tokens.
  static absl::StatusOr<std::unique_ptr<TokenShard>> OpenLlmc(const std::string& path);

  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }
  int token_bytes() const { return width_; }
  const std::string& name() const { return name_; }  // the file the errors name
  // Copies tokens [first, first + count) of the concatenation into out.
  void Read(int64_t first, int64_t count, int64_t* out) const;

 private:
  TokenShard() = default;
  struct Mapping {
    const uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  static absl::StatusOr<Mapping> Map(const std::string& path);
  int64_t TokenAt(const uint8_t* p) const;

  std::string name_;
  Mapping bin_, idx_;
  int width_ = 2;
  bool is_signed_ = false;
  int64_t tokens_ = 0, documents_ = 1;
  int64_t data_offset_ = 0;  // bytes before the first token (contiguous shards)
  // Non-contiguous Megatron shards: each run's first token in the concatenation and its byte
  // offset in the .bin (empty when the runs follow one another in the .bin).
  std::vector<int64_t> run_start_, run_offset_;
};

}  // namespace varuna

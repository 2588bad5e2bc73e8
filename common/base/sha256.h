#pragma once

// SHA-256 (FIPS 180-4), for identifying files (a tokenizer's tokenizer.json in data
// manifests). Not for secrets: no constant-time claims.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varuna {

class Sha256 {
 public:
  Sha256();
  void Update(absl::string_view bytes);
  std::string HexDigest();  // 64 lowercase hex digits; ends the hash

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t length_ = 0;  // bytes so far
};

// Hex SHA-256 of a regular file's contents; errors name the path.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace varuna

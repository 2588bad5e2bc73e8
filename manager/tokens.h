#pragma once

// Bearer tokens for varunactl -> manager (docs/operations.md "Security"). The tokens file has
// one "NAME TOKEN" per line (# comments, blank lines); the name is recorded on the jobs that
// token submits or cancels.

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace varuna {

class TokenTable {
 public:
  // Parses the file's text; errors name the line. Tokens must be at least 16 characters.
  static absl::StatusOr<TokenTable> Parse(const std::string& text, const std::string& name);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The name a token belongs to; compares every known token in constant time.
  std::optional<std::string> Lookup(const std::string& token) const;
  size_t size() const { return by_token_.size(); }

 private:
  std::map<std::string, std::string> by_token_;  // token -> name
};

// The token of an "authorization: Bearer TOKEN" header value; empty if it is not one.
std::string BearerToken(const std::string& header);

}  // namespace varuna

#pragma once

// Bearer tokens for varunactl and the HTTP API -> manager (docs/operations.md "Security"). The
// tokens file has one "NAME TOKEN [USER]" per line (# comments, blank lines); the name is
// recorded on the jobs that token submits or cancels, and USER (a Unix user name) is who the
// agents run those jobs' workers as (each agent only if its --allowed_worker_users has it).

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace varuna {

// A portable Unix user name (what useradd accepts by default).
bool IsUnixUserName(const std::string& s);

class TokenTable {
 public:
  // Parses the file's text; errors name the line. Tokens must be at least 16 characters.
  static absl::StatusOr<TokenTable> Parse(const std::string& text, const std::string& name);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  struct Caller {
    std::string name;
    std::string unix_user;  // "" = none given
  };
  // Who a token belongs to; compares every known token in constant time.
  std::optional<Caller> Find(const std::string& token) const;
  std::optional<std::string> Lookup(const std::string& token) const {
    auto c = Find(token);
    return c ? std::optional<std::string>(c->name) : std::nullopt;
  }
  size_t size() const { return by_token_.size(); }

 private:
  std::map<std::string, Caller> by_token_;  // token -> caller
};

}  // namespace varuna

#pragma once

// Bearer tokens for varunactl and the HTTP API -> manager (docs/operations.md "Security"). The
// tokens file has one "NAME TOKEN [USER|-] [admin|user]" per line (# comments, blank lines);
// the name is recorded on the jobs that token submits or cancels, USER (a Unix user name; "-"
// for none) is who the agents run those jobs' workers as (each agent only if its
// --allowed_worker_users has it), and the role is what the token may do (Note [Roles] in
// manager/api/access.cc). A role needs all four words; a line without one is a user's. A file
// in which no line says admin gives every token the admin role (how files without roles
// behaved), and TokenTable::roles() says so.

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/launch/tenant_uid.h"

namespace varuna {

// A portable Unix user name (what useradd accepts by default).
bool IsUnixUserName(const std::string& s);

class TokenTable {
 public:
  // Parses the file's text; errors name the line. Tokens must be at least 16 characters.
  static absl::StatusOr<TokenTable> Parse(const std::string& text, const std::string& name);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  enum class Role { kUser, kAdmin };
  struct Caller {
    std::string name;
    std::string unix_user;     // "" = none given
    Role role = Role::kAdmin;  // without a tokens file every caller is an admin
    uint32_t uid = 0;          // without unix_user: the tenant's uid (0 = none; AssignTenantUids)
  };
  // Who a token belongs to; compares every known token in constant time.
  std::optional<Caller> Find(const std::string& token) const;
  std::optional<std::string> Lookup(const std::string& token) const {
    auto c = Find(token);
    return c ? std::optional<std::string>(c->name) : std::nullopt;
  }
  // The caller of a token name (every line of one name has the same role).
  std::optional<Caller> ByName(const std::string& name) const;
  size_t size() const { return by_token_.size(); }
  // Whether some line says admin: roles are enforced. Without, every token is an admin.
  bool roles() const { return roles_; }
  // Gives every name's tokens without a Unix user the tenant's uid in `range` (Note [Tenant
  // uids] in common/launch/tenant_uid.cc; an empty range: none). Errors name two tenants
  // whose uids meet.
  absl::Status AssignTenantUids(const UidRange& range);

 private:
  std::map<std::string, Caller> by_token_;  // token -> caller
  bool roles_ = false;
};

}  // namespace varuna

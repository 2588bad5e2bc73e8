#pragma once

// Note [Tenant uids] in tenant_uid.cc: the Unix uid a tenant's workers run as when its token
// names no user of its own, the same on every agent and after any loss of the manager's state.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varuna {

// Uids FIRST..LAST; empty (both 0) = none.
struct UidRange {
  uint32_t first = 0;
  uint32_t last = 0;
  bool empty() const { return first == 0 && last == 0; }
  bool Contains(uint32_t uid) const { return !empty() && uid >= first && uid <= last; }
  std::string ToString() const;
};

// The default of the manager's tenant_uids and the agent's --allowed_worker_uids: they match,
// so isolation needs no configuration.
inline constexpr char kDefaultTenantUids[] = "1900000000-1900999999";

// "FIRST-LAST" or "none". Errors name the text: not two numbers, FIRST > LAST, a range that
// reaches below 1000 (root and the system's users) or past 2^31-2 (tools that read uids as
// signed numbers).
absl::StatusOr<UidRange> ParseUidRange(absl::string_view text);

// The uid of tenant `name` in `range` (not empty): a fixed hash of the name, so every manager
// and every agent computes the same one. Two names can meet on one uid: the manager checks
// its tokens at start (TokenTable::AssignTenantUids).
uint32_t TenantUid(absl::string_view name, const UidRange& range);

}  // namespace varuna

#include "common/launch/tenant_uid.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace varuna {

// Note [Tenant uids]: jobs of different tenants never share a Unix uid, or one job could read
// another's memory (/proc/PID/mem), files and environment. A token line with a USER runs its
// jobs as that user (agents that allow it). Every other token name gets a uid of its own from
// the manager's `tenant_uids` range: the name's FNV-1a hash, modulo the range's size. A hash
// and not a counter: the uid follows from the name alone, so it is the same on every agent
// (a checkpoint directory shared between nodes keeps one owner), on every manager of an HA
// group, and after the manager's state is lost or restored, when a counter would hand a
// tenant's old uid, and with it the files it left on the nodes, to someone else. The uid
// needs no passwd entry: the worker runs with gid = uid and no other groups, HOME its
// generation's directory. The job record keeps the uid it was submitted with. The agent runs
// it only if it is in its --allowed_worker_uids (the same default range), and never root.
// The range's default starts above systemd's container uid ranges (524288-1879048191,
// systemd's "Users, Groups, UIDs and GIDs on systemd Systems"), below 2^31.

std::string UidRange::ToString() const { return empty() ? "none" : absl::StrCat(first, "-", last); }

absl::StatusOr<UidRange> ParseUidRange(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text == "none") return UidRange{};
  std::vector<absl::string_view> parts = absl::StrSplit(text, '-');
  UidRange r;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.first) ||
      !absl::SimpleAtoi(parts[1], &r.last)) {
    return absl::InvalidArgumentError(absl::StrCat("uid range '", text, "': want FIRST-LAST (e.g. ",
                                                   kDefaultTenantUids, ") or none"));
  }
  if (r.first > r.last) {
    return absl::InvalidArgumentError(absl::StrCat("uid range '", text, "': FIRST > LAST"));
  }
  if (r.first < 1000 || r.last > 2147483646u) {
    return absl::InvalidArgumentError(absl::StrCat(
        "uid range '", text,
        "' must lie within 1000-2147483646 (not root or the system's users, and below 2^31-1)"));
  }
  return r;
}

uint32_t TenantUid(absl::string_view name, const UidRange& range) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a, 64 bits
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  const uint64_t size = static_cast<uint64_t>(range.last) - range.first + 1;
  return range.first + static_cast<uint32_t>(h % size);
}

}  // namespace varuna

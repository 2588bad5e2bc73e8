// Tenant uids (Note [Tenant uids] in common/launch/tenant_uid.cc): ranges as the manager's
// config and the agent's flag give them, and a uid that follows from the name alone.

#include "common/launch/tenant_uid.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::StatusIs;

TEST(TenantUidTest, RangesParseOrSayWhatIsWrong) {
  ASSERT_OK_AND_ASSIGN(UidRange d, ParseUidRange(kDefaultTenantUids));
  EXPECT_EQ(d.first, 1900000000u);
  EXPECT_EQ(d.last, 1900999999u);
  EXPECT_EQ(d.ToString(), kDefaultTenantUids);
  ASSERT_OK_AND_ASSIGN(UidRange none, ParseUidRange(" none "));
  EXPECT_TRUE(none.empty());
  EXPECT_FALSE(none.Contains(1900000000u));
  EXPECT_EQ(none.ToString(), "none");
  for (const char* bad : {"", "5", "a-b", "2000-1000", "0-5000", "999-2000", "1000-4294967295",
                          "1000-2000-3000", "-1000"}) {
    EXPECT_THAT(ParseUidRange(bad), StatusIs(absl::StatusCode::kInvalidArgument, "uid range"))
        << bad;
  }
  ASSERT_OK_AND_ASSIGN(UidRange one, ParseUidRange("5000-5000"));
  EXPECT_TRUE(one.Contains(5000));
  EXPECT_FALSE(one.Contains(5001));
}

TEST(TenantUidTest, AUidFollowsFromTheNameAloneAndStaysInTheRange) {
  const UidRange r = *ParseUidRange(kDefaultTenantUids);
  // Fixed forever: a tenant's files on every node are owned by this number.
  EXPECT_EQ(TenantUid("alice", r), TenantUid("alice", r));
  EXPECT_NE(TenantUid("alice", r), TenantUid("bob", r));
  std::set<uint32_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t uid = TenantUid(absl::StrCat("tenant", i), r);
    EXPECT_TRUE(r.Contains(uid)) << uid;
    seen.insert(uid);
  }
  EXPECT_GE(seen.size(), 998u) << "spread over the range";
  const UidRange tiny = *ParseUidRange("5000-5001");
  EXPECT_TRUE(tiny.Contains(TenantUid("alice", tiny)));
}

}  // namespace
}  // namespace varuna

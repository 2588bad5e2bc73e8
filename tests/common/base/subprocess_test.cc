// RunCommand: output, exit status, the time limit, a program that is not there.

#include "common/base/subprocess.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

TEST(RunCommandTest, CapturesOutputAndStatus) {
  auto r = RunCommand({"sh", "-c", "echo out; echo err >&2; echo \"$V\"; exit 3"}, {{"V", "set"}},
                      absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->out, "out\nset\n");
  EXPECT_EQ(r->err, "err\n");
}

TEST(RunCommandTest, BoundsOutput) {
  auto r = RunCommand({"sh", "-c", "head -c 100000 /dev/zero"}, {}, absl::Seconds(10), 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->out.size(), 1000u);
}

TEST(RunCommandTest, KillsWhatOutlivesItsTimeIncludingChildrenHoldingThePipes) {
  const absl::Time start = absl::Now();
  auto r = RunCommand({"sh", "-c", "sleep 30 & sleep 30"}, {}, absl::Milliseconds(300));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("did not finish in 300ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(RunCommandTest, NamesAProgramThatIsNotThere) {
  auto r = RunCommand({"varuna-no-such-program"}, {}, absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("cannot run varuna-no-such-program"));
  EXPECT_FALSE(RunCommand({}, {}, absl::Seconds(1)).ok());
}

}  // namespace
}  // namespace varuna

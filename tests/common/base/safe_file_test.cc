// Files that someone else controls (common/base/safe_file.h), here the owned reads the agent
// makes of what a job wrote (Note [Files a job wrote] in agent/agent.cc): a planted link, a
// FIFO, a file of another user are refused, and their content never reaches an error.

#include "common/base/safe_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

namespace fs = std::filesystem;

class OwnedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/owned_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    secret_ = dir_ + "/secret";  // outside the job's directory: what an attack points at
    std::ofstream(secret_) << "TOPSECRET-LINE\n";
    job_ = dir_ + "/gen1";
    fs::create_directories(job_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, secret_, job_;
};

TEST_F(OwnedFileTest, ReadsTheWritersOwnRegularFile) {
  std::ofstream(job_ + "/progress.rank0") << "line 1\nline 2\n";
  auto all = ReadOwnedFile(job_, "progress.rank0", ::geteuid(), 1024, "progress file");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, "line 1\nline 2\n");
  auto slice = ReadOwnedFileSlice(job_, "progress.rank0", ::geteuid(), 7, 100, "progress file");
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->data, "line 2\n");
  EXPECT_EQ(slice->size, 14);
  EXPECT_FALSE(ReadOwnedFile(job_, "progress.rank0", ::geteuid(), 4, "progress file").ok());
}

TEST_F(OwnedFileTest, APlantedLinkFifoOrPathIsRefusedWithoutItsContent) {
  fs::create_symlink(secret_, job_ + "/profile.json");
  auto linked = ReadOwnedFile(job_, "profile.json", ::geteuid(), 1024, "profile");
  ASSERT_FALSE(linked.ok());
  EXPECT_THAT(std::string(linked.status().message()), ::testing::HasSubstr("profile"));
  EXPECT_THAT(std::string(linked.status().message()),
              ::testing::Not(::testing::HasSubstr("TOPSECRET")));
  ASSERT_EQ(mkfifo((job_ + "/fifo").c_str(), 0600), 0);
  EXPECT_FALSE(ReadOwnedFile(job_, "fifo", ::geteuid(), 1024, "progress file").ok());
  EXPECT_FALSE(ReadOwnedFile(job_, "../secret", ::geteuid(), 1024, "progress file").ok());
  EXPECT_FALSE(ReadOwnedFile(job_, "missing", ::geteuid(), 1024, "progress file").ok());
}

// As root (the agent's case): a file another user owns, a hard link of root's own file made
// by the job's user included, is not read on that user's behalf.
TEST_F(OwnedFileTest, AFileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to own files as another user";
  const uid_t job_uid = 65534;  // nobody
  std::ofstream(job_ + "/mine") << "ok\n";
  ASSERT_EQ(::chown((job_ + "/mine").c_str(), job_uid, job_uid), 0);
  auto own = ReadOwnedFile(job_, "mine", job_uid, 1024, "profile");
  EXPECT_TRUE(own.ok()) << own.status();
  std::ofstream(job_ + "/theirs") << "TOPSECRET-LINE\n";
  ASSERT_EQ(::chown((job_ + "/theirs").c_str(), 4242, 4242), 0);
  auto theirs = ReadOwnedFile(job_, "theirs", job_uid, 1024, "profile");
  ASSERT_FALSE(theirs.ok());
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(theirs.status().message()), ::testing::HasSubstr("uid 4242"));
  EXPECT_THAT(std::string(theirs.status().message()),
              ::testing::Not(::testing::HasSubstr("TOPSECRET")));
}

}  // namespace
}  // namespace varuna

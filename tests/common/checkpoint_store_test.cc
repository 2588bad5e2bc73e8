#include "common/checkpoint_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

namespace fs = std::filesystem;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("ckpt_store_test_", ::testing::UnitTest::GetInstance()->random_seed(), "_",
                        getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A two-writer checkpoint with one layer file each, complete unless told otherwise.
  void Write(int64_t step, bool complete = true) {
    const std::string path = CheckpointPath(dir_.string(), step);
    fs::create_directories(path + "/layers");
    const std::string common =
        "{\"step\": " + std::to_string(step) + ", \"writers\": [0, 1], \"layers\": [\"a\", \"b\"]}";
    ASSERT_THAT(WriteFileAtomic(path + "/common.json", common, 0), IsOk());
    ASSERT_THAT(WriteFileAtomic(path + "/layers/a.pt", std::string(1000, 'a'), 0), IsOk());
    ASSERT_THAT(WriteFileAtomic(path + "/layers/b.pt", std::string(500, 'b'), 1), IsOk());
    ASSERT_THAT(WriteManifestAndMarker(path, 0,
                                       {DigestBytes("common.json", common),
                                        DigestBytes("layers/a.pt", std::string(1000, 'a'))}),
                IsOk());
    if (complete) {
      ASSERT_THAT(
          WriteManifestAndMarker(path, 1, {DigestBytes("layers/b.pt", std::string(500, 'b'))}),
          IsOk());
    }
  }
  std::string Path(int64_t step) { return CheckpointPath(dir_.string(), step); }

  fs::path dir_;
};

TEST_F(CheckpointStoreTest, CompleteCheckpointVerifies) {
  Write(4);
  EXPECT_THAT(VerifyCheckpoint(Path(4)), IsOk());
  EXPECT_EQ(ListCheckpointSteps(dir_.string()), std::vector<int64_t>{4});
}

TEST_F(CheckpointStoreTest, DamageIsNamed) {
  Write(1);
  {
    std::fstream f(Path(1) + "/layers/a.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('X');
  }
  EXPECT_THAT(VerifyCheckpoint(Path(1)), StatusIs(absl::StatusCode::kDataLoss, "checksum"));
  EXPECT_THAT(VerifyCheckpoint(Path(1), /*checksums=*/false), IsOk());
  fs::resize_file(Path(1) + "/layers/a.pt", 10);
  EXPECT_THAT(VerifyCheckpoint(Path(1)), StatusIs(absl::StatusCode::kDataLoss, "10 bytes"));
  Write(2, /*complete=*/false);
  EXPECT_THAT(VerifyCheckpoint(Path(2)),
              StatusIs(absl::StatusCode::kDataLoss, "writer rank 1 never finished"));
  Write(3);
  fs::remove(Path(3) + "/layers/b.pt");
  EXPECT_THAT(VerifyCheckpoint(Path(3)), StatusIs(absl::StatusCode::kDataLoss, "missing file"));
}

TEST_F(CheckpointStoreTest, ResolveResumeStep) {
  auto none = ResolveResumeStep(dir_.string(), std::nullopt);
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());
  Write(2, /*complete=*/false);
  EXPECT_THAT(ResolveResumeStep(dir_.string(), std::nullopt),
              StatusIs(absl::StatusCode::kFailedPrecondition, "none is complete"));
  Write(1);
  Write(3, /*complete=*/false);
  auto latest = ResolveResumeStep(dir_.string(), std::nullopt);
  ASSERT_THAT(latest, IsOk());
  EXPECT_EQ(**latest, 1);
  EXPECT_THAT(ResolveResumeStep(dir_.string(), 3),
              StatusIs(absl::StatusCode::kFailedPrecondition, "varuna_ckpt_3"));
}

TEST_F(CheckpointStoreTest, RetentionKeepsNewestCompleteAndInProgress) {
  Write(2);
  Write(4);
  Write(6);
  Write(8, /*complete=*/false);  // maybe still being written
  EXPECT_EQ(PruneCheckpoints(dir_.string(), 2), std::vector<int64_t>{2});
  EXPECT_EQ(ListCheckpointSteps(dir_.string()), (std::vector<int64_t>{8, 6, 4}));
  // Never deletes the newest complete one, even with keep = 1 and a newer incomplete one.
  EXPECT_EQ(PruneCheckpoints(dir_.string(), 1), std::vector<int64_t>{4});
  EXPECT_EQ(ListCheckpointSteps(dir_.string()), (std::vector<int64_t>{8, 6}));
  EXPECT_TRUE(PruneCheckpoints(dir_.string(), 0).empty());
}

}  // namespace
}  // namespace varuna

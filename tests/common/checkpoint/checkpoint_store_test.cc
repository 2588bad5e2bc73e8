#include "common/checkpoint/checkpoint_store.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

  // A two-writer checkpoint with one layer file each, complete unless told otherwise; the
  // layer files end in `ext` (".pt": format 1, which a common.json without "format" is).
  void Write(int64_t step, bool complete = true, std::string common = "",
             const std::string& ext = ".pt") {
    const std::string path = CheckpointPath(dir_.string(), step);
    fs::create_directories(path + "/layers");
    if (common.empty()) common = Common(step, "[0, 1]", "[\"a\", \"b\"]");
    const std::string a = "layers/a" + ext, b = "layers/b" + ext;
    ASSERT_THAT(WriteFileAtomic(path + "/common.json", common, 0), IsOk());
    ASSERT_THAT(WriteFileAtomic(path + "/" + a, std::string(1000, 'a'), 0), IsOk());
    ASSERT_THAT(WriteFileAtomic(path + "/" + b, std::string(500, 'b'), 1), IsOk());
    ASSERT_THAT(
        WriteManifestAndMarker(
            path, 0, {DigestBytes("common.json", common), DigestBytes(a, std::string(1000, 'a'))}),
        IsOk());
    if (complete) {
      ASSERT_THAT(WriteManifestAndMarker(path, 1, {DigestBytes(b, std::string(500, 'b'))}), IsOk());
    }
  }
  std::string Path(int64_t step) { return CheckpointPath(dir_.string(), step); }
  static std::string Common(int64_t step, const std::string& writers, const std::string& layers) {
    return absl::StrCat("{\"step\": ", step,
                        ", \"global_batch\": 8, \"stages\": 2, \"replicas\": 1, \"loss_scale\": 1, "
                        "\"clean_steps\": 0, \"writers\": ",
                        writers, ", \"layers\": ", layers, "}");
  }
  void Manifest(int64_t step, const std::string& json) {
    ASSERT_THAT(WriteFileAtomic(Path(step) + "/manifest.rank0.json", json, 0), IsOk());
  }

  fs::path dir_;
};

TEST_F(CheckpointStoreTest, CompleteCheckpointVerifies) {
  Write(4);
  EXPECT_THAT(VerifyCheckpoint(Path(4)), IsOk());
  EXPECT_EQ(ListCheckpointSteps(dir_.string()), std::vector<int64_t>{4});
}

TEST_F(CheckpointStoreTest, FormattedCommonReadsBack) {
  CheckpointCommon c;
  c.step = 7;
  c.global_batch = 8;
  c.stages = 2;
  c.replicas = 1;
  c.world = 2;
  c.micro_batch = 4;
  c.stage_to_rank_map = "0;1;";
  c.pipelines = "0,1|2";
  c.loss_scale = 65536.5;
  c.clean_steps = 3;
  c.writers = {0, 1};
  c.layers = {"a", "b"};
  const std::string spec = "model: {kind: \"gpt\"}\nname: a\\b";
  Write(7, true, FormatCheckpointCommon(c, {{"model_spec", spec}}), ".safetensors");
  EXPECT_THAT(VerifyCheckpoint(Path(7)), IsOk());
  auto back = ReadCheckpointCommon(Path(7));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->format, kCheckpointFormat);
  EXPECT_EQ(back->step, 7);
  EXPECT_EQ(back->world, 2);
  EXPECT_EQ(back->pipelines, "0,1|2");
  EXPECT_EQ(back->loss_scale, 65536.5);
  EXPECT_EQ(back->clean_steps, 3);
  EXPECT_EQ(back->writers, c.writers);
  EXPECT_EQ(back->layers, c.layers);
  EXPECT_EQ(back->model_spec, "model: {kind: \"gpt\"} name: a\\b");  // newlines become spaces
  EXPECT_EQ(back->eval_step, 0);                                     // no validation recorded
}

// The newest validation before a step (Note [Validation] in worker/engine/varuna.cc)
// reads back for a resume to carry on; a record that is not one is damage naming it.
TEST_F(CheckpointStoreTest, AValidationRecordReadsBackOrIsDamage) {
  CheckpointCommon c;
  c.step = 5;
  c.global_batch = 8;
  c.stages = 2;
  c.replicas = 1;
  c.world = 2;
  c.writers = {0, 1};
  c.layers = {"a", "b"};
  Write(5, true, FormatCheckpointCommon(c, {{"eval_step", "3"}, {"eval_loss", "4.25"}}),
        ".safetensors");
  auto back = ReadCheckpointCommon(Path(5));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->eval_step, 3);
  EXPECT_EQ(back->eval_loss, 4.25);
  c.step = 6;
  Write(6, true, FormatCheckpointCommon(c, {{"eval_step", "three"}, {"eval_loss", "4.25"}}),
        ".safetensors");
  EXPECT_THAT(ReadCheckpointCommon(Path(6)).status(),
              StatusIs(absl::StatusCode::kDataLoss, "eval_step 'three'"));
  c.step = 7;
  Write(7, true, FormatCheckpointCommon(c, {{"eval_step", "3"}}), ".safetensors");
  EXPECT_THAT(ReadCheckpointCommon(Path(7)).status(),
              StatusIs(absl::StatusCode::kDataLoss, "'eval_loss' is missing"));
}

// The layer files a checkpoint must hold follow its format: format 1 (no "format" field, or
// 1) is layers/<l>.pt, format 2 layers/<l>.safetensors; a format this build does not know is
// damage that names it, not a guess.
TEST_F(CheckpointStoreTest, LayerFilesFollowTheFormat) {
  EXPECT_EQ(LayerFileOf(1, "blocks.0"), "layers/blocks.0.pt");
  EXPECT_EQ(LayerFileOf(2, "blocks.0"), "layers/blocks.0.safetensors");
  auto common = [](int step, const std::string& format) {
    return absl::StrCat("{", format, "\"step\": ", step,
                        ", \"global_batch\": 8, \"stages\": 2, \"replicas\": 1, \"loss_scale\": 1, "
                        "\"clean_steps\": 0, \"writers\": [0, 1], \"layers\": [\"a\", \"b\"]}");
  };
  Write(1, true, common(1, "\"format\": 1, "), ".pt");
  EXPECT_THAT(VerifyCheckpoint(Path(1)), IsOk());
  Write(2, true, common(2, "\"format\": 2, "), ".safetensors");
  EXPECT_THAT(VerifyCheckpoint(Path(2)), IsOk());
  Write(3, true, common(3, "\"format\": 2, "), ".pt");
  EXPECT_THAT(VerifyCheckpoint(Path(3)),
              StatusIs(absl::StatusCode::kDataLoss, "no writer recorded layers/a.safetensors"));
  Write(4, true, common(4, "\"format\": 3, "), ".safetensors");
  EXPECT_THAT(VerifyCheckpoint(Path(4)),
              StatusIs(absl::StatusCode::kDataLoss, "format 3 is not one this build reads"));
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

// Note [Parser boundary] (common/spec/submission.cc): what a checkpoint's metadata says is data,
// not trusted.
TEST_F(CheckpointStoreTest, EmptyWritersOrLayersAreNotComplete) {
  Write(1, true, Common(1, "[]", "[]"));
  EXPECT_THAT(VerifyCheckpoint(Path(1)), StatusIs(absl::StatusCode::kDataLoss, "no writers"));
  Write(2, true, Common(2, "[0, 1]", "[]"));
  EXPECT_THAT(VerifyCheckpoint(Path(2)), StatusIs(absl::StatusCode::kDataLoss, "no layers"));
  // A layer of the model missing from the checkpoint: not complete for that model.
  Write(3);
  const std::vector<std::string> model = {"a", "b", "c"};
  EXPECT_THAT(VerifyCheckpoint(Path(3), true, &model),
              StatusIs(absl::StatusCode::kDataLoss, "no layer 'c'"));
  auto latest = ResolveResumeStep(dir_.string(), std::nullopt, &model);
  EXPECT_THAT(latest, StatusIs(absl::StatusCode::kFailedPrecondition, "no layer 'c'"));
}

TEST_F(CheckpointStoreTest, WrongTypesAndMissingFieldsAreDamageNotCrashes) {
  Write(1, true, "{\"writers\": [0, 1], \"layers\": [\"a\", \"b\"]}");  // no step
  EXPECT_THAT(VerifyCheckpoint(Path(1)), StatusIs(absl::StatusCode::kDataLoss, "'step'"));
  EXPECT_THAT(ReadCheckpointCommon(Path(1)).status(),
              StatusIs(absl::StatusCode::kDataLoss, "'step' is missing"));
  Write(2);
  Manifest(2, "{\"files\": [{\"path\": \"layers/a.pt\", \"size\": \"big\", \"crc32\": 1}]}");
  EXPECT_THAT(VerifyCheckpoint(Path(2)), StatusIs(absl::StatusCode::kDataLoss, "'size'"));
  EXPECT_THAT(VerifyCheckpoint(Path(2), false), StatusIs(absl::StatusCode::kDataLoss, "'size'"));
  Manifest(2, "{\"files\": {\"a\": 1}}");
  EXPECT_THAT(VerifyCheckpoint(Path(2)), StatusIs(absl::StatusCode::kDataLoss, "no files list"));
  Write(3, true, Common(9, "[0, 1]", "[\"a\", \"b\"]"));  // step disagrees with the directory
  EXPECT_THAT(VerifyCheckpoint(Path(3)), StatusIs(absl::StatusCode::kDataLoss, "directory"));
  Write(4, true, Common(4, "[0, 5]", "[\"a\"]"));  // writer 5 outside 2 stages x 1 replica
  EXPECT_THAT(VerifyCheckpoint(Path(4)), StatusIs(absl::StatusCode::kDataLoss, "writer rank 5"));
  // The tool's and the resume's view: all damaged, none used, no crash.
  EXPECT_THAT(ResolveResumeStep(dir_.string(), std::nullopt),
              StatusIs(absl::StatusCode::kFailedPrecondition, "none is complete"));
}

TEST_F(CheckpointStoreTest, PathsStayInsideAndOnlyRegularFilesAreRead) {
  Write(1);
  Manifest(1, "{\"files\": [{\"path\": \"../../../../dev/zero\", \"size\": 1, \"crc32\": 0}]}");
  EXPECT_THAT(VerifyCheckpoint(Path(1)), StatusIs(absl::StatusCode::kDataLoss, "'..'"));
  Manifest(1, "{\"files\": [{\"path\": \"/etc/passwd\", \"size\": 1, \"crc32\": 0}]}");
  EXPECT_THAT(VerifyCheckpoint(Path(1), false), StatusIs(absl::StatusCode::kDataLoss, "absolute"));
  // A FIFO (or a link to a device) in place of a layer file: refused at once, not read.
  Write(2);
  fs::remove(Path(2) + "/layers/b.pt");
  ASSERT_EQ(mkfifo((Path(2) + "/layers/b.pt").c_str(), 0600), 0);
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(VerifyCheckpoint(Path(2)), StatusIs(absl::StatusCode::kDataLoss, "regular file"));
  EXPECT_THAT(VerifyCheckpoint(Path(2), false), StatusIs(absl::StatusCode::kDataLoss, "b.pt"));
  Write(3);
  fs::remove(Path(3) + "/layers/a.pt");
  fs::create_symlink("/dev/zero", Path(3) + "/layers/a.pt");
  EXPECT_THAT(VerifyCheckpoint(Path(3)), StatusIs(absl::StatusCode::kDataLoss, "regular file"));
  Write(4);
  fs::remove(Path(4) + "/common.json");
  ASSERT_EQ(mkfifo((Path(4) + "/common.json").c_str(), 0600), 0);
  EXPECT_THAT(VerifyCheckpoint(Path(4)), StatusIs(absl::StatusCode::kDataLoss, "regular file"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

}  // namespace
}  // namespace varuna

namespace varuna {
namespace {

namespace fs = std::filesystem;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

// Note [Rescue] (worker/engine/checkpoint.cc): survivors of a failed step write their stage's
// layers and a rescue record each; the checkpoint is complete when the rescuers cover every layer,
// and a rescuer whose files are damaged is left out if the others still cover the model.
TEST(RescueTest, RescueRecordsThatCoverTheModelMakeACompleteCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("rescue_test_", getpid());
  fs::remove_all(dir);
  const std::string path = CheckpointPath(dir.string(), 7);
  fs::create_directories(path + "/layers");
  auto common = [](int writer) {
    return absl::StrCat(
        "{\"step\": 7, \"global_batch\": 8, \"stages\": 2, \"replicas\": 2, \"loss_scale\": 1, "
        "\"clean_steps\": 0, \"writers\": [",
        writer, "], \"layers\": [\"a\", \"b\"], \"model_spec\": \"m\"}\n");
  };
  auto rescue = [&](int rank, const std::string& layer, const std::string& bytes) {
    const std::string rel = absl::StrCat("layers/", layer, ".pt");
    ASSERT_THAT(WriteFileAtomic(path + "/" + rel, bytes, rank), IsOk());
    ASSERT_THAT(WriteRescueRecord(path, rank, common(rank), {DigestBytes(rel, bytes)}), IsOk());
  };
  const std::vector<std::string> layers = {"a", "b"};
  rescue(0, "a", std::string(100, 'a'));  // stage 0, replica 0
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
              StatusIs(absl::StatusCode::kDataLoss, "layers/b.pt"))
      << "layer b has no rescuer yet";
  rescue(3, "b", std::string(50, 'b'));  // stage 1, replica 1
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers), IsOk());
  auto c = ReadCheckpointCommon(path);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->step, 7);
  EXPECT_EQ(c->model_spec, "m");
  auto resolved = ResolveResumeStep(dir.string(), std::nullopt, &layers);
  ASSERT_THAT(resolved.status(), IsOk());
  EXPECT_EQ(*resolved, std::optional<int64_t>(7));

  // A second rescuer of stage 1 whose record lies about a file is left out; coverage holds.
  ASSERT_THAT(WriteRescueRecord(path, 1, common(1), {FileDigest{"layers/b.pt", 50, 12345u}}),
              IsOk());
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers), IsOk());
  // Damage the only copy of layer a: no longer complete, and the reason says why.
  ASSERT_THAT(WriteFileAtomic(path + "/layers/a.pt", std::string(100, 'x'), 0), IsOk());
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
              StatusIs(absl::StatusCode::kDataLoss, "checksum"));
  fs::remove_all(dir);
}

// Note [Rolled rescue] (checkpoint_store.cc): rank 0 applied step 7 and records its update;
// rank 1, the only survivor of stage 1, is at step 6 with step 7 pending and writes its layer
// with step 7's gradients into step 7's directory. The two complete step 7 only together.
TEST(RescueTest, PendingLayersCountOnlyBesideARecordedUpdate) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("rolled_rescue_test_", getpid());
  fs::remove_all(dir);
  const std::string path = CheckpointPath(dir.string(), 7);
  fs::create_directories(path + "/layers");
  fs::create_directories(path + "/pending");
  const std::vector<std::string> layers = {"a", "b"};
  auto rescue = [&](const std::string& update) {
    const std::string rel = "layers/a.safetensors", bytes(100, 'a');
    ASSERT_THAT(WriteFileAtomic(path + "/" + rel, bytes, 0), IsOk());
    ASSERT_THAT(WriteRescueRecord(path, 0,
                                  absl::StrCat("{\"format\": 2, \"step\": 7, \"global_batch\": 8, "
                                               "\"stages\": 2, \"replicas\": 1, \"loss_scale\": 1, "
                                               "\"clean_steps\": 0, \"writers\": [0], \"layers\": "
                                               "[\"a\", \"b\"]",
                                               update, "}\n"),
                                  {DigestBytes(rel, bytes)}),
                IsOk());
  };
  auto pending = [&](int64_t batch, const std::string& bytes) {
    const std::string rel = PendingLayerFileOf("b");
    EXPECT_EQ(rel, "pending/b.safetensors");
    ASSERT_THAT(WriteFileAtomic(path + "/" + rel, bytes, 1), IsOk());
    ASSERT_THAT(WritePendingRecord(path, 1, 7, batch, {"b"}, {DigestBytes(rel, bytes)}), IsOk());
  };
  pending(8, std::string(60, 'b'));
  rescue("");  // a rescuer at 7 that never agreed on 7 here (it loaded it): no update
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
              StatusIs(absl::StatusCode::kDataLoss, "layers/b.safetensors"))
      << "without the update nobody can bring layer b to step 7";
  rescue(", \"update_skipped\": \"0\", \"update_grad_norm\": \"0.75\"");
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers), IsOk());
  auto c = ReadCheckpointCommon(path);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_TRUE(c->has_update);
  EXPECT_FALSE(c->update_skipped);
  EXPECT_EQ(c->update_grad_norm, 0.75);
  auto resolved = ResolveResumeStep(dir.string(), std::nullopt, &layers);
  ASSERT_THAT(resolved.status(), IsOk());
  EXPECT_EQ(*resolved, std::optional<int64_t>(7));

  // A pending record of another job's shape, or a damaged pending file, covers nothing.
  pending(16, std::string(60, 'b'));
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
              StatusIs(absl::StatusCode::kDataLoss, "global batch 16"));
  pending(8, std::string(60, 'b'));
  ASSERT_THAT(WriteFileAtomic(path + "/pending/b.safetensors", std::string(60, 'x'), 1), IsOk());
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
              StatusIs(absl::StatusCode::kDataLoss, "checksum"));

  // Pending layers of another generation (an earlier split at this step) never combine with
  // this generation's update; of an unrecorded generation (0) they do.
  rescue(", \"update_skipped\": \"0\", \"update_grad_norm\": \"0.75\", \"generation\": \"3\"");
  {
    const std::string rel = PendingLayerFileOf("b"), bytes(60, 'b');
    ASSERT_THAT(WriteFileAtomic(path + "/" + rel, bytes, 1), IsOk());
    ASSERT_THAT(WritePendingRecord(path, 1, 7, 8, {"b"}, {DigestBytes(rel, bytes)}, 2), IsOk());
    EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
                StatusIs(absl::StatusCode::kDataLoss, "from generation 2"));
    ASSERT_THAT(WritePendingRecord(path, 1, 7, 8, {"b"}, {DigestBytes(rel, bytes)}, 3), IsOk());
    EXPECT_THAT(VerifyCheckpoint(path, true, &layers), IsOk());
    auto c = ReadCheckpointCommon(path);
    ASSERT_THAT(c.status(), IsOk());
    EXPECT_EQ(c->generation, 3);
    // The update is the step's, whichever rescuer recorded it: the lowest may not have.
    ASSERT_THAT(
        WriteRescueRecord(path, 1,
                          "{\"format\": 2, \"step\": 7, \"global_batch\": 8, \"stages\": 2, "
                          "\"replicas\": 1, \"loss_scale\": 1, \"clean_steps\": 0, "
                          "\"writers\": [1], \"layers\": [\"a\", \"b\"], "
                          "\"update_skipped\": \"1\", \"update_grad_norm\": \"0\"}\n",
                          {DigestBytes("layers/a.safetensors", std::string(100, 'a'))}),
        IsOk());
    rescue("");  // rank 0's record, without it
    c = ReadCheckpointCommon(path);
    ASSERT_THAT(c.status(), IsOk());
    EXPECT_TRUE(c->has_update);
    EXPECT_TRUE(c->update_skipped);
    ASSERT_TRUE(fs::remove(path + "/rescue.rank1.json") && fs::remove(path + "/rescued.rank1"));
  }

  // An update record that is not one is damage, named.
  rescue(", \"update_skipped\": \"maybe\", \"update_grad_norm\": \"0.75\"");
  EXPECT_THAT(VerifyCheckpoint(path, true, &layers),
              StatusIs(absl::StatusCode::kDataLoss, "is not an agreed update"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace varuna

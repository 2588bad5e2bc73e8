#include "common/spec/submission.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

TEST(EnvFileTest, ReadsEveryLineWithExportsCommentsAndQuotes) {
  auto env = ParseEnvFile(
      "# cluster settings\nNCCL_DEBUG=INFO\n\nexport OMP_NUM_THREADS=2\nMSG=\"a b\"\nX='y'\n", "f");
  ASSERT_THAT(env.status(), IsOk());
  EXPECT_THAT(*env, UnorderedElementsAre(Pair("NCCL_DEBUG", "INFO"), Pair("OMP_NUM_THREADS", "2"),
                                         Pair("MSG", "a b"), Pair("X", "y")));
  EXPECT_THAT(ParseEnvFile("A=1\nnot an assignment\n", "f.env"),
              StatusIs(absl::StatusCode::kInvalidArgument, "f.env line 2"));
  EXPECT_THAT(ParseEnvFile("1A=1\n", "f"), StatusIs(absl::StatusCode::kInvalidArgument, "line 1"));
}

TEST(ExperimentFileTest, OneCommandPerEntryWithContinuationsAndComments) {
  auto cmds = ParseExperimentFile(
      "# experiment_configurations.txt\n\npython main.py --train --batch_size 6\n"
      "python main.py \\\n--train \\\n--batch_size 8\n  # indented comment\n"
      "prog 'a b' \"c d\" e\\ f\n",
      "x.txt");
  ASSERT_THAT(cmds.status(), IsOk());
  ASSERT_EQ(cmds->size(), 3u);
  EXPECT_THAT((*cmds)[0], ElementsAre("python", "main.py", "--train", "--batch_size", "6"));
  EXPECT_THAT((*cmds)[1], ElementsAre("python", "main.py", "--train", "--batch_size", "8"));
  EXPECT_THAT((*cmds)[2], ElementsAre("prog", "a b", "c d", "e f"));
  EXPECT_THAT(ParseExperimentFile("# nothing\n", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no commands"));
  EXPECT_THAT(ParseExperimentFile("ok\nbad 'quote\n", "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 2"));
}

class PrepareSubmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/sub_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = std::filesystem::path(tmpl).lexically_normal().string();
    std::ofstream(dir_ + "/corpus.txt") << "hello world";
    std::ofstream(dir_ + "/cluster.env") << "A=from_file\nB=from_file\n";
    Write(
        "name: j\nmodel: {kind: gpt, layers: 2, d_model: 16, heads: 2, seq_len: 4}\n"
        "data: {kind: text, path: corpus.txt}\nenv_file: cluster.env\nenv: {B: from_spec}\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& text) { std::ofstream(dir_ + "/job.yaml") << text; }

  std::string dir_;
};

TEST_F(PrepareSubmissionTest, AppliesOverridesPathsAndEnvInOrder) {
  SubmitOptions opts;
  opts.sets = {"train.lr=0.01", "parallel.stages=auto", "name=renamed"};
  opts.env = {"C=from_flag", "A=flag_wins"};
  auto yaml = PrepareSubmission(dir_ + "/job.yaml", opts);
  ASSERT_THAT(yaml.status(), IsOk());
  auto spec = ParseJobSpec(*yaml);
  ASSERT_THAT(spec.status(), IsOk());
  EXPECT_EQ(spec->name, "renamed");
  EXPECT_DOUBLE_EQ(spec->train.lr, 0.01);
  EXPECT_EQ(spec->parallel.stages, 0);
  EXPECT_EQ(spec->data.path, dir_ + "/corpus.txt");  // resolved against the job file
  EXPECT_TRUE(spec->env_file.empty());               // merged on the submitting side
  EXPECT_THAT(spec->env, UnorderedElementsAre(Pair("A", "flag_wins"), Pair("B", "from_spec"),
                                              Pair("C", "from_flag")));
}

// The eval section's data and the TensorBoard directory resolve against the job file too.
TEST_F(PrepareSubmissionTest, EvalDataAndTensorBoardPathsAreResolved) {
  std::ofstream(dir_ + "/val.txt") << "held out";
  Write(
      "name: j\nmodel: {kind: gpt, layers: 2, d_model: 16, heads: 2, seq_len: 4}\n"
      "data: {kind: text, path: corpus.txt}\neval: {data: {kind: text, path: val.txt}}\n"
      "observability: {tensorboard_dir: runs/tb}\n");
  auto yaml = PrepareSubmission(dir_ + "/job.yaml", SubmitOptions{});
  ASSERT_THAT(yaml.status(), IsOk());
  auto spec = ParseJobSpec(*yaml);
  ASSERT_THAT(spec.status(), IsOk());
  EXPECT_EQ(spec->eval.data.path, dir_ + "/val.txt");
  EXPECT_EQ(spec->observability.tensorboard_dir, dir_ + "/runs/tb");
}

TEST_F(PrepareSubmissionTest, RefusesBadSpecsNamingTheProblem) {
  const std::string job = dir_ + "/job.yaml";
  EXPECT_THAT(PrepareSubmission(dir_ + "/nope.yaml", {}),
              StatusIs(absl::StatusCode::kNotFound, "nope.yaml"));
  SubmitOptions typo;
  typo.sets = {"train.lrr=1"};
  EXPECT_THAT(PrepareSubmission(job, typo),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'train.lrr'"));
  SubmitOptions neg;
  neg.sets = {"train.lr=-1"};
  EXPECT_THAT(PrepareSubmission(job, neg),
              StatusIs(absl::StatusCode::kInvalidArgument, "train.lr"));
  SubmitOptions bad_env;
  bad_env.env = {"no_equals"};
  EXPECT_THAT(PrepareSubmission(job, bad_env),
              StatusIs(absl::StatusCode::kInvalidArgument, "KEY=VALUE"));
  Write("name: [broken\n");
  EXPECT_THAT(PrepareSubmission(job, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "malformed YAML"));
  Write("name: j\ndata: {kind: text, path: missing.txt}\n");
  EXPECT_THAT(PrepareSubmission(job, {}), StatusIs(absl::StatusCode::kNotFound, "missing.txt"));
  Write("name: j\ndata: {kind: text, path: corpus.txt}\nenv_file: gone.env\n");
  EXPECT_THAT(PrepareSubmission(job, {}), StatusIs(absl::StatusCode::kNotFound, "gone.env"));
}

TEST_F(PrepareSubmissionTest, HostileInputsAreRefusedNotCrashedOn) {
  const std::string job = dir_ + "/job.yaml";
  SubmitOptions dev_zero;
  dev_zero.env_file = "/dev/zero";  // would read until out of memory
  EXPECT_THAT(PrepareSubmission(job, dev_zero),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a regular file"));
  Write("? [a, b]\n: 1\n");
  EXPECT_THAT(PrepareSubmission(job, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a plain name"));
  Write("data: 5\nmodel: [1]\n");  // sections that are not mappings
  EXPECT_THAT(PrepareSubmission(job, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be a mapping"));
  Write("data: {path: corpus.txt}\nenv: {A: [1, 2, 3]}\n");
  EXPECT_THAT(PrepareSubmission(job, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'env.A' must be a single value"));
  Write("data: {path: corpus.txt}\nenv: {'A=B': 1}\n");
  EXPECT_THAT(PrepareSubmission(job, {}), StatusIs(absl::StatusCode::kInvalidArgument, "env.A=B"));
  Write("data: {path: corpus.txt}\n");
  SubmitOptions empty_key;
  empty_key.sets = {"train..lr=1"};
  EXPECT_THAT(PrepareSubmission(job, empty_key),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty key"));
}

}  // namespace
}  // namespace varuna

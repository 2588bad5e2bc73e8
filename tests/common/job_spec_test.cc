#include "common/job_spec.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

constexpr char kGood[] = R"(
name: tiny
model: {kind: gpt, layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 256}
data: {kind: text, path: /etc/hostname}
train: {global_batch: 8, steps: 3, lr: 1e-3, warmup: 1, schedule: cosine, precision: bf16}
parallel: {stages: 2, micro_batch: auto, schedule: 1f1b}
checkpoint: {dir: /tmp/ck, every_steps: 10, keep: 2}
resources: {min_slots: 2, max_slots: 4}
entrypoint: []
env: {FOO: bar}
)";

TEST(JobSpecTest, ParsesAllSections) {
  auto spec = ParseJobSpec(kGood);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name, "tiny");
  EXPECT_EQ(spec->model.layers, 2);
  EXPECT_EQ(spec->train.global_batch, 8);
  EXPECT_EQ(spec->train.precision, "bf16");
  EXPECT_EQ(spec->parallel.stages, 2);
  EXPECT_EQ(spec->parallel.micro_batch, 0);  // auto
  EXPECT_EQ(spec->parallel.schedule, "1f1b");
  EXPECT_EQ(spec->checkpoint.keep, 2);
  EXPECT_EQ(spec->env.at("FOO"), "bar");
}

TEST(JobSpecTest, UnknownKeyIsNamedWithItsPath) {
  std::string text = kGood;
  text += "train2: 1\n";
  EXPECT_THAT(ParseJobSpec(text), StatusIs(absl::StatusCode::kInvalidArgument, "'train2'"));
  auto nested = ParseJobSpec(R"(
data: {kind: text, path: /x}
train: {lrr: 1}
)");
  EXPECT_THAT(nested, StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'train.lrr'"));
}

TEST(JobSpecTest, BadValuesAreNamed) {
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ntrain: {lr: -1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "train.lr"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {schedule: zigzag}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "zigzag"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel: {layers: many}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.layers"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel: {d_model: 30, heads: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must divide model.d_model"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {dir: /c, resume: newest}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "checkpoint.resume"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {dir: /c, resume: 0}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "step number >= 1, got '0'"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {resume: latest}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs checkpoint.dir"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {dir: /c, resume: 40}\n"), IsOk());
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel: {vocab: 100}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "text data is bytes"));
  EXPECT_THAT(ParseJobSpec("model: {kind: gpt}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "data.path"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {stages: -2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.stages"));
}

absl::Status Shape(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  if (!spec.ok()) return spec.status();
  return spec->ValidateShape();
}

TEST(JobSpecTest, ShapesNoClusterCanRunAreRefused) {
  // Parsing accepts them (a recovering manager must load old rows); ValidateShape refuses.
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {stages: 3}\nresources: {max_slots: 2}\n"),
              IsOk());
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 3}\nresources: {max_slots: 2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs at least 3 slots"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2, replicas: 3}\n"
                    "train: {global_batch: 12}\nresources: {max_slots: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs at least 6 slots"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {replicas: 3}\ntrain: {global_batch: 8}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not divisible by parallel.replicas"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2, replicas: 1}\n"
                    "resources: {min_slots: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "resources.min_slots"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2, replicas: 2}\n"
                    "train: {global_batch: 8}\nresources: {min_slots: 4, max_slots: 4}\n"),
              IsOk());
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2}\nresources: {min_slots: 4}\n"),
              IsOk());  // replicas auto can grow to min_slots
}

TEST(JobSpecTest, MalformedYaml) {
  EXPECT_THAT(ParseJobSpec("model: {kind: gpt"),
              StatusIs(absl::StatusCode::kInvalidArgument, "malformed YAML"));
  EXPECT_THAT(ParseJobSpec(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ParseJobSpec("- a\n- b\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be a mapping"));
}

TEST(JobSpecTest, MissingFiles) {
  EXPECT_THAT(LoadJobSpec("/nonexistent/job.yaml"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/job.yaml"));
  auto spec = ParseJobSpec("data: {path: /nonexistent/data.txt}\n");
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(spec->ValidateFiles(),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/data.txt"));
}

}  // namespace
}  // namespace varuna

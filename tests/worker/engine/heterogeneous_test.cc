#include "worker/engine/heterogeneous.h"
#include "worker/models/registry.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

Model Gpt(int layers) {
  ModelSpec spec;
  spec.layers = layers;
  spec.d_model = 16;
  spec.heads = 2;
  spec.seq_len = 8;
  return *BuildModel(spec);
}

TEST(PipelineTemplateTest, GetModulesIsTheOrderedLayerList) {
  EXPECT_THAT(PipelineTemplate::GetModules(Gpt(2)),
              ElementsAre("embed", "blocks.0", "blocks.1", "head"));
}

TEST(PipelineTemplateTest, CreateChecksAgainstTheModel) {
  const Model m = Gpt(2);
  ASSERT_OK_AND_ASSIGN(
      PipelineTemplate t,
      PipelineTemplate::Create("gpt", {{"embed", "blocks.0"}, {"blocks.1", "head"}}, m));
  EXPECT_EQ(t.num_stages(), 2);
  EXPECT_THAT(t.boundaries(), ElementsAre(0, 2, 4));
  EXPECT_THAT(
      PipelineTemplate::Create("gpt", {{"embed"}, {"blocks.1", "blocks.0", "head"}}, m).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "Modules in the pipeline template do not match the modules in "
               "the model."));
  EXPECT_THAT(
      PipelineTemplate::Create("gpt", {{"blocks.0"}, {"embed", "blocks.1", "head"}}, m).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "The first stage must contain"));
  EXPECT_THAT(PipelineTemplate::Create("gpt", {{"embed", "blocks.0", "blocks.1"}, {"head"}, {}}, m)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "The last stage must contain"));
  EXPECT_THAT(PipelineTemplate::Create("t5", {PipelineTemplate::GetModules(m)}, m).status(),
              StatusIs(absl::StatusCode::kUnimplemented, "Auto policy for t5 is not implemented"));
}

TEST(HeterogeneousParallelPluginTest, SetPipelinesBuildsTheTopology) {
  const Model m = Gpt(2);
  ASSERT_OK_AND_ASSIGN(
      auto two, PipelineTemplate::Create("gpt", {{"embed", "blocks.0"}, {"blocks.1", "head"}}, m));
  ASSERT_OK_AND_ASSIGN(auto one,
                       PipelineTemplate::Create("gpt", {PipelineTemplate::GetModules(m)}, m));
  ASSERT_OK_AND_ASSIGN(auto plugin, HeterogeneousParallelPlugin::Create(1, 2, "fp32"));
  ASSERT_THAT(plugin.SetPipelines({two, one, one}, {{two, 4}, {one, 1}}, 4), IsOk());
  EXPECT_EQ(plugin.topology().ToString(), "0,2,4:8;0,4:2;0,4:2");
  EXPECT_EQ(plugin.global_batch(), 12);
  EXPECT_EQ(plugin.precision(), Precision::kFp32);
}

TEST(HeterogeneousParallelPluginTest, TheSeedsErrors) {
  const Model m = Gpt(2);
  ASSERT_OK_AND_ASSIGN(
      auto two, PipelineTemplate::Create("gpt", {{"embed", "blocks.0"}, {"blocks.1", "head"}}, m));
  ASSERT_OK_AND_ASSIGN(auto one,
                       PipelineTemplate::Create("gpt", {PipelineTemplate::GetModules(m)}, m));
  EXPECT_THAT(HeterogeneousParallelPlugin::Create(0, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tp_size must be in [1, 64], got 0"));
  // world = sum(stages per pipeline) x tp_size.
  ASSERT_OK_AND_ASSIGN(auto tp2, HeterogeneousParallelPlugin::Create(2, 2));
  EXPECT_THAT(tp2.SetPipelines({two, one}, {{two, 4}, {one, 1}}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Number of ranks in pipeline templates (6) does not match world "
                       "size (3)."));
  EXPECT_THAT(tp2.SetPipelines({two, one}, {{two, 4}, {one, 1}}, 6), IsOk());
  EXPECT_EQ(tp2.topology().world_size(), 3);  // positions, each of tp_size processes
  EXPECT_THAT(HeterogeneousParallelPlugin::Create(1, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(HeterogeneousParallelPlugin::Create(1, 2, "fp8").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  ASSERT_OK_AND_ASSIGN(auto plugin, HeterogeneousParallelPlugin::Create(1, 2));
  EXPECT_THAT(plugin.SetPipelines({two, one}, {{two, 4}, {one, 1}}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Number of ranks in pipeline templates (3) does not match world "
                       "size (4)."));
  EXPECT_THAT(plugin.SetPipelines({two, one}, {{two, 4}}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "All pipelines must have a corresponding number of "
                       "microbatches."));
  EXPECT_THAT(plugin.SetPipelines({two, one}, {{two, 4}, {one, 1}, {two, 3}}, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "identical pipeline templates must have the same number"));
  EXPECT_THAT(plugin.SetPipelines({}, {}, 0), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

}  // namespace
}  // namespace varuna

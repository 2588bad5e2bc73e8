#include "common/pipeline/topology.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/launch/launch_args.h"
#include "common/pipeline/pipeline_template.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_topology.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

TEST(TopologyTest, ParseLaysPipelinesOutContiguously) {
  ASSERT_OK_AND_ASSIGN(Topology t, Topology::Parse("0,3,6:12;0,2,4,6:8;0,6:4"));
  EXPECT_EQ(t.world_size(), 6);
  EXPECT_EQ(t.num_pipelines(), 3);
  EXPECT_EQ(t.global_batch(), 24);
  EXPECT_FALSE(t.uniform());
  EXPECT_EQ(t.pipeline(1).first_rank, 2);
  EXPECT_EQ(t.pipeline(2).first_rank, 5);
  EXPECT_EQ(t.PipelineOf(0), 0);
  EXPECT_EQ(t.PipelineOf(4), 1);
  EXPECT_EQ(t.StageOf(4), 2);
  EXPECT_EQ(t.PipelineOf(5), 2);
  EXPECT_TRUE(t.IsLastStage(1));
  EXPECT_TRUE(t.IsLastStage(5));
  EXPECT_FALSE(t.IsLastStage(3));
  EXPECT_EQ(t.SampleOffset(0), 0);
  EXPECT_EQ(t.SampleOffset(1), 12);
  EXPECT_EQ(t.SampleOffset(2), 20);
  EXPECT_EQ(t.SegmentsOf(3), (std::pair<int, int>(2, 4)));
  EXPECT_EQ(t.ToString(), "0,3,6:12;0,2,4,6:8;0,6:4");
  EXPECT_THAT(t.Validate(6, 24), IsOk());
}

TEST(TopologyTest, HoldersAreOneRankPerPipeline) {
  ASSERT_OK_AND_ASSIGN(Topology t, Topology::Parse("0,3,6:12;0,6:4"));
  EXPECT_THAT(t.Holders(0), ElementsAre(0, 2));
  EXPECT_THAT(t.Holders(2), ElementsAre(0, 2));
  EXPECT_THAT(t.Holders(3), ElementsAre(1, 2));
  EXPECT_THAT(t.Holders(5), ElementsAre(1, 2));
  // Segments with the same holders share one group, in segment order.
  EXPECT_EQ(t.HolderSets(), (std::vector<std::vector<int>>{{0, 2}, {1, 2}}));
  ASSERT_OK_AND_ASSIGN(Topology u, Topology::Parse("0,2,4:4;0,1,4:4"));
  EXPECT_EQ(u.HolderSets(), (std::vector<std::vector<int>>{{0, 2}, {0, 3}, {1, 3}}));
  ASSERT_OK_AND_ASSIGN(Topology single, Topology::Parse("0,3,6:4"));
  EXPECT_TRUE(single.HolderSets().empty());
}

TEST(TopologyTest, UniformMatchesTheStageMap) {
  ASSERT_OK_AND_ASSIGN(Topology t, Topology::Uniform(3, 2, 12));
  EXPECT_TRUE(t.uniform());
  EXPECT_FALSE(t.has_boundaries());
  EXPECT_EQ(t.ToStageMap().ToString(), "0,3;1,4;2,5;");
  // Without boundaries the groups are the stages' replicas, whatever the cut.
  EXPECT_EQ(t.HolderSets(), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(t.StageOf(r), StageMap::Make(3, 2).StageOf(r));
    EXPECT_EQ(t.PipelineOf(r), StageMap::Make(3, 2).ReplicaOf(r));
  }
  ASSERT_THAT(t.SetUniformBoundaries({0, 1, 4, 6}), IsOk());
  EXPECT_EQ(t.HolderSets(), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(t.ToString(), "0,1,4,6:6;0,1,4,6:6");
  EXPECT_THAT(t.SetUniformBoundaries({0, 6}), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(Topology::Uniform(2, 3, 10).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not divisible"));
}

TEST(TopologyTest, BadTextIsAnErrorNamingIt) {
  for (const char* bad :
       {"", "0,3", "0,3:x", "1,3:4", "0,3,3:4", "0,3:4;0,2:4", "0,3:0", "0,a:4", "0:4", ":4"}) {
    EXPECT_THAT(Topology::Parse(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument, ""))
        << bad;
  }
  EXPECT_THAT(Topology::Parse("0,3:4;0,2:4").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "whole model"));
  ASSERT_OK_AND_ASSIGN(Topology t, Topology::Parse("0,3,6:12;0,6:4"));
  EXPECT_THAT(t.Validate(7, 16), StatusIs(absl::StatusCode::kInvalidArgument, "the model has 7"));
  EXPECT_THAT(t.Validate(6, 15),
              StatusIs(absl::StatusCode::kInvalidArgument, "train.global_batch is 15"));
}

JobSpec GptSpec(int layers) {
  JobSpec spec;
  spec.model.layers = layers;
  return spec;
}

TEST(PipelineTemplateTest, BoundariesFromModules) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> modules, BuiltinModules(GptSpec(2).model));
  EXPECT_THAT(modules, ElementsAre("embed", "blocks.0", "blocks.1", "head"));
  ASSERT_OK_AND_ASSIGN(
      std::vector<int> b,
      TemplateBoundaries("gpt", modules, {{"embed", "blocks.0"}, {"blocks.1", "head"}}));
  EXPECT_THAT(b, ElementsAre(0, 2, 4));
  ASSERT_OK_AND_ASSIGN(b, TemplateBoundaries("gpt", modules, {modules}));
  EXPECT_THAT(b, ElementsAre(0, 4));
  // Modules 0-1 and 2-3 share segments: a stage may end only at a segment's end.
  ASSERT_OK_AND_ASSIGN(b, TemplateBoundaries("torchscript", {"a", "b", "c", "d"},
                                             {{"a", "b"}, {"c", "d"}}, {0, 0, 1, 1}));
  EXPECT_THAT(b, ElementsAre(0, 1, 2));
  EXPECT_THAT(TemplateBoundaries("torchscript", {"a", "b", "c", "d"}, {{"a"}, {"b", "c", "d"}},
                                 {0, 0, 1, 1})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a cut point"));
}

TEST(PipelineTemplateTest, TheSeedsErrors) {
  const std::vector<std::string> m = {"embed", "blocks.0", "blocks.1", "head"};
  auto err = [&](std::vector<std::vector<std::string>> stages, const std::string& model = "gpt") {
    auto r = TemplateBoundaries(model, m, stages);
    return r.ok() ? std::string("OK") : std::string(r.status().message());
  };
  const std::string mismatch =
      "Modules in the pipeline template do not match the modules in the model.";
  EXPECT_THAT(err({{"embed", "blocks.1"}, {"blocks.0", "head"}}),
              ::testing::AllOf(HasSubstr(mismatch), HasSubstr("out of order")));
  EXPECT_THAT(err({{"embed", "blocks.0"}, {"head"}}),
              ::testing::AllOf(HasSubstr(mismatch), HasSubstr("'blocks.1' is missing")));
  EXPECT_THAT(err({{"embed", "blocks.0", "blocks.0"}, {"blocks.1", "head"}}),
              HasSubstr("'blocks.0' is listed twice"));
  EXPECT_THAT(err({{"embed", "blocks.0", "blocks.7"}, {"blocks.1", "head"}}),
              HasSubstr("'blocks.7' is not a module of the model"));
  EXPECT_EQ(err({{"blocks.0"}, {"embed", "blocks.1", "head"}}),
            "The first stage must contain the embedding module 'embed'.");
  EXPECT_EQ(err({{"embed", "blocks.0", "blocks.1", "head"}, {}}),
            "The last stage must contain the head module 'head'.");
  EXPECT_THAT(err({{"embed"}, {}, {"blocks.0", "blocks.1", "head"}}), HasSubstr("stage 1"));
  auto t5 = TemplateBoundaries("t5", m, {m});
  EXPECT_THAT(t5.status(),
              StatusIs(absl::StatusCode::kUnimplemented, "Auto policy for t5 is not implemented"));
  EXPECT_THAT(std::string(t5.status().message()),
              HasSubstr("Supported models are [gpt, mlp, torchscript, llama, gpt2, bert]"));
}

constexpr char kHetero[] = R"(
model: {kind: gpt, layers: 2, d_model: 16, heads: 2, seq_len: 8}
data: {path: /dev/null}
train: {global_batch: 12}
parallel:
  micro_batch: 2
  pipelines:
    - {stages: [[embed, blocks.0], [blocks.1, head]], count: 1, microbatches: 4}
    - {stages: [[embed, blocks.0, blocks.1, head]], count: 2, microbatches: 1}
)";

TEST(PipelineSpecTest, ParsesIntoATopology) {
  ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(kHetero));
  ASSERT_EQ(spec.parallel.pipelines.size(), 2u);
  EXPECT_EQ(PipelineRanks(spec.parallel), 4);
  EXPECT_THAT(spec.ValidateShape(), IsOk());
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> modules, BuiltinModules(spec.model));
  ASSERT_OK_AND_ASSIGN(Topology t, TopologyFromSpec(spec, modules, 4));
  EXPECT_EQ(t.ToString(), "0,2,4:8;0,4:2;0,4:2");
  EXPECT_THAT(TopologyFromSpec(spec, modules, 5).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Number of ranks in pipeline templates (4) does not match world "
                       "size (5)."));
}

TEST(PipelineSpecTest, LaunchArgsResolveThePipelines) {
  ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(kHetero));
  WorkerArgs args;
  auto env = [](const std::string& k) -> std::optional<std::string> {
    if (k == "WORLD_SIZE") return "4";
    if (k == "RANK") return "2";
    return std::nullopt;
  };
  ASSERT_OK_AND_ASSIGN(WorkerTopology topo, ResolveTopology(args, &spec, 4, env));
  EXPECT_EQ(topo.replica, 1);
  EXPECT_EQ(topo.stage, 0);
  EXPECT_EQ(topo.per_replica_batch, 2);
  EXPECT_EQ(topo.sample_offset, 8);
  EXPECT_EQ(topo.micro_batch, 2);
  auto env3 = [](const std::string& k) -> std::optional<std::string> {
    if (k == "WORLD_SIZE") return "3";
    if (k == "RANK") return "0";
    return std::nullopt;
  };
  EXPECT_THAT(ResolveTopology(args, &spec, 4, env3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Number of ranks in pipeline templates (4) does not match"));
  // The manager's --pipelines wins over the spec.
  args.pipelines = "0,1,4:6;0,4:6";
  auto env2 = [](const std::string& k) -> std::optional<std::string> {
    if (k == "WORLD_SIZE") return "3";
    if (k == "RANK") return "2";
    return std::nullopt;
  };
  ASSERT_OK_AND_ASSIGN(topo, ResolveTopology(args, &spec, 4, env2));
  EXPECT_EQ(topo.replica, 1);
  EXPECT_EQ(topo.sample_offset, 6);
}

TEST(PipelineSpecTest, SpecErrorsNameTheProblem) {
  auto err = [](const std::string& pipelines, const std::string& extra = "", int64_t batch = 12) {
    auto r = ParseJobSpec(absl::StrCat(
        "model: {kind: gpt, layers: 2}\ndata: {path: /dev/null}\ntrain: {global_batch: ", batch,
        "}\nparallel:\n  micro_batch: 2\n", extra, "  pipelines:\n", pipelines));
    if (!r.ok()) return std::string(r.status().message());
    absl::Status s = r->ValidateShape();
    return s.ok() ? std::string("OK") : std::string(s.message());
  };
  const std::string two =
      "    - {stages: [[embed, blocks.0], [blocks.1, head]], microbatches: 4}\n";
  const std::string one = "    - {stages: [[embed, blocks.0, blocks.1, head]], microbatches: 2}\n";
  EXPECT_EQ(err(two + one), "OK");
  EXPECT_THAT(err("    - {stages: [[embed, blocks.0], [blocks.1, head]]}\n" + one),
              HasSubstr("All pipelines must have a corresponding number of microbatches."));
  EXPECT_THAT(
      err(two + "    - {stages: [[embed, blocks.0], [blocks.1, head]], microbatches: 2}\n", "", 12),
      HasSubstr("identical templates must have the same number of microbatches"));
  EXPECT_THAT(err(two + one, "", 14), HasSubstr("inconsistent with the pipelines"));
  EXPECT_THAT(err(two + one, "  stages: 2\n"), HasSubstr("replaces parallel.stages"));
  EXPECT_THAT(err("    - {stages: [[blocks.0], [embed, blocks.1, head]], microbatches: 4}\n" + one),
              HasSubstr("The first stage must contain the embedding module 'embed'."));
  EXPECT_THAT(err("    - {stages: [[embed, blocks.1], [blocks.0, head]], microbatches: 4}\n" + one),
              HasSubstr("Modules in the pipeline template do not match the modules in the model."));
  EXPECT_THAT(err("    - {stages: [[embed, blocks.0], [blocks.1, head]], microbatches: 4, "
                  "count: 0}\n" +
                  one),
              HasSubstr("count"));
  EXPECT_THAT(err("    - {stagez: []}\n"), HasSubstr("unknown key"));
  EXPECT_THAT(err("    - 3\n"), HasSubstr("must be a mapping"));
}

}  // namespace
}  // namespace varuna

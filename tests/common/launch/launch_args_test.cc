#include "common/launch/launch_args.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

EnvGetter Env(std::map<std::string, std::string> m) {
  return [m](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

JobSpec Spec(int stages, int64_t global_batch) {
  JobSpec s;
  s.data.path = "/x";
  s.parallel.stages = stages;
  s.train.global_batch = global_batch;
  return s;
}

TEST(LaunchArgsTest, AcceptsVarunaAndTorchrunStyles) {
  auto a = ParseWorkerArgs({"w", "--job", "j.yaml", "--rank=3", "--local_rank=1",
                            "--stage_to_rank_map=0,2;1,3;", "--chunk_size=4", "--batch-size=8",
                            "--metrics_out=m.jsonl", "--steps", "5"});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->job_path, "j.yaml");
  EXPECT_EQ(*a->rank, 3);
  EXPECT_EQ(*a->local_rank, 1);
  EXPECT_EQ(*a->stage_to_rank_map, "0,2;1,3;");
  EXPECT_EQ(*a->chunk_size, 4);
  EXPECT_EQ(*a->per_replica_batch, 8);
  EXPECT_EQ(*a->steps, 5);
}

TEST(LaunchArgsTest, BadFlags) {
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--bogus=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--bogus"));
  EXPECT_THAT(ParseWorkerArgs({"w", "--job"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs a value"));
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--steps=x"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--steps"));
  EXPECT_THAT(ParseWorkerArgs({"w"}), StatusIs(absl::StatusCode::kInvalidArgument, "--job"));
}

// --timeline_out FILE [--trace_steps N] (worker/runtime/timeline_out.h).
TEST(LaunchArgsTest, TimelineAndTrace) {
  auto a = ParseWorkerArgs({"w", "--job", "j", "--timeline_out", "t.jsonl", "--trace_steps=3"});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->timeline_out, "t.jsonl");
  EXPECT_EQ(a->trace_steps, 3);
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--trace_steps", "3"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "give --timeline_out FILE too"));
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--timeline_out", "t", "--trace_steps", "0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--trace_steps must be in [1, 1000]"));
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--timeline_out="}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--timeline_out needs a file name"));
}

TEST(LaunchArgsTest, ResolvesTopologyFromMapAndEnv) {
  WorkerArgs a;
  a.stage_to_rank_map = "0,2;1,3;";
  JobSpec s = Spec(2, 16);
  auto t =
      ResolveTopology(a, &s, 6, Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1234"}}));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->stage, 1);
  EXPECT_EQ(t->replica, 1);
  EXPECT_EQ(t->per_replica_batch, 8);
  EXPECT_EQ(t->micro_batch, 1);  // auto: 8 / (4*2)
  EXPECT_EQ(t->master_port, 1234);
}

// The plan's tp_size (Note [Tensor-parallel placement] in manager/nodes/placement.cc) replaces the
// spec's: --tp_size for varuna-worker, VARUNA_TP_SIZE for a program of the user's.
TEST(LaunchArgsTest, ThePlansTpSizeReplacesTheSpecs) {
  auto a = ParseWorkerArgs({"w", "--job", "j", "--tp_size", "2", "--stage_to_rank_map", "0,1;"});
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a->tp_size, 2);
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--tp_size", "0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "flag --tp_size must be in [1, 64]"));
  JobSpec s = Spec(1, 8);
  s.model.kind = "gpt";
  s.model.heads = 4;
  s.model.d_model = 32;
  s.parallel.tp_size = 0;  // auto
  auto t = ResolveTopology(*a, &s, 6, Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}}));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->tp_size, 2);
  EXPECT_EQ(t->tp_rank, 1);
  EXPECT_EQ(t->rank, 1);
  EXPECT_EQ(t->world_size, 2);
  WorkerArgs from_env;
  from_env.stage_to_rank_map = "0;";
  s.parallel.tp_size = 0;
  t = ResolveTopology(from_env, &s, 6,
                      Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"VARUNA_TP_SIZE", "4"}}));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->tp_size, 4);
  EXPECT_EQ(t->world_size, 1);
  s.parallel.tp_size = 0;  // auto without a plan: 1
  t = ResolveTopology(from_env, &s, 6, Env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->tp_size, 1);
  EXPECT_THAT(ResolveTopology(from_env, &s, 6,
                              Env({{"RANK", "0"}, {"WORLD_SIZE", "3"}, {"VARUNA_TP_SIZE", "3"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parallel.tp_size = 3 does not divide model.heads = 4"));
  EXPECT_THAT(ResolveTopology(from_env, &s, 6,
                              Env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"VARUNA_TP_SIZE", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "VARUNA_TP_SIZE=0 is invalid"));
}

TEST(LaunchArgsTest, MapMustMatchWorldAndStages) {
  WorkerArgs a;
  a.stage_to_rank_map = "0,2;1,3;";
  JobSpec s = Spec(2, 16);
  EXPECT_THAT(ResolveTopology(a, &s, 6, Env({{"WORLD_SIZE", "2"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "WORLD_SIZE is 2"));
  JobSpec s4 = Spec(4, 16);
  EXPECT_THAT(ResolveTopology(a, &s4, 6, Env({{"WORLD_SIZE", "4"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.stages=4 disagrees"));
  JobSpec s2 = Spec(2, 15);
  EXPECT_THAT(ResolveTopology(a, &s2, 6, Env({{"WORLD_SIZE", "4"}, {"RANK", "1"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "not divisible"));
  // Without a rank every process would think it is rank 0 and host the store.
  JobSpec s3 = Spec(2, 16);
  EXPECT_THAT(ResolveTopology(a, &s3, 6, Env({{"WORLD_SIZE", "4"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "set RANK"));
  a.stage_to_rank_map = "0;1;2;3;";
  JobSpec s0 = Spec(0, 16);
  EXPECT_THAT(ResolveTopology(a, &s0, 3, Env({{"WORLD_SIZE", "4"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "3 segments"));
}

TEST(LaunchArgsTest, BatchSizeFlagIsPerReplica) {
  WorkerArgs a;
  a.stage_to_rank_map = "0,2;1,3;";
  a.per_replica_batch = 6;
  a.chunk_size = 2;
  JobSpec s = Spec(2, 16);
  auto t = ResolveTopology(a, &s, 6, Env({{"WORLD_SIZE", "4"}, {"RANK", "0"}}));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->global_batch, 12);
  EXPECT_EQ(t->micro_batch, 2);
}

TEST(LaunchArgsTest, AgentStoreFlag) {
  WorkerArgs a;
  JobSpec s = Spec(1, 4);
  auto t = ResolveTopology(a, &s, 3, Env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  ASSERT_THAT(t, IsOk());
  EXPECT_TRUE(t->store_is_external);
}

TEST(LaunchArgsTest, WorldSizeZeroAndOversizedMicroBatchAreErrors) {
  auto args = ParseWorkerArgs({"w", "--job", "j.yaml"});
  ASSERT_THAT(args, IsOk());
  JobSpec spec = Spec(1, 8);
  EXPECT_THAT(ResolveTopology(*args, &spec, 4, Env({{"WORLD_SIZE", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "WORLD_SIZE=0"));
  EXPECT_THAT(ResolveTopology(*args, &spec, 4, Env({{"WORLD_SIZE", "-3"}, {"RANK", "0"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, "WORLD_SIZE=-3"));
  auto chunk = ParseWorkerArgs({"w", "--job", "j.yaml", "--chunk_size=16"});
  ASSERT_THAT(chunk, IsOk());
  JobSpec spec2 = Spec(1, 8);
  EXPECT_THAT(ResolveTopology(*chunk, &spec2, 4, Env({})),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.micro_batch (16)"));
  EXPECT_THAT(ParseWorkerArgs({"w", "--job", "j", "--steps", "99999999999"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--steps"));
}

}  // namespace
}  // namespace varuna

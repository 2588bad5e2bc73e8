// The launch contract (common/launch/launch_contract.h): what RankContract writes,
// ParseWorkerArgs reads back unchanged; a user's entrypoint gets the plan in the environment
// instead of flags.

#include "common/launch/launch_contract.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "common/launch/launch_args.h"
#include "common/launch/worker_protocol.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

LaunchContract TwoByTwo() {
  LaunchContract c;
  c.job_id = "7";
  c.job_name = "gpt";
  c.generation = 3;
  c.world_size = 4;
  c.local_world_size = 2;
  c.master_addr = "10.0.0.1";
  c.master_port = 29500;
  c.spec_path = "/var/lib/varuna/jobs/7/gen3/job.yaml";
  c.gen_dir = "/var/lib/varuna/jobs/7/gen3";
  c.node = "node1";
  c.node_addr = "10.0.0.2";
  c.stage_to_rank_map = "0,2;1,3;";
  c.micro_batch = 2;
  c.per_replica_batch = 12;
  c.schedule = "1f1b";
  c.stage_boundaries = {0, 3, 6};
  c.resume_step = "auto";
  c.in_place = true;
  c.worker_binary = "/usr/bin/varuna-worker";
  return c;
}

TEST(LaunchContractTest, WhatTheAgentWritesTheWorkerReadsBack) {
  const RankProcess p = RankContract(TwoByTwo(), 3, 1, "/p", {{"PATH", "/bin"}});
  ASSERT_OK_AND_ASSIGN(WorkerArgs a, ParseWorkerArgs(p.argv));
  EXPECT_EQ(a.job_path, "/var/lib/varuna/jobs/7/gen3/job.yaml");
  EXPECT_EQ(a.rank, 3);
  EXPECT_EQ(a.local_rank, 1);
  EXPECT_EQ(a.stage_to_rank_map, "0,2;1,3;");
  EXPECT_EQ(a.chunk_size, 2);
  EXPECT_EQ(a.per_replica_batch, 12);
  EXPECT_EQ(a.schedule, "1f1b");
  EXPECT_EQ(a.stage_boundaries, (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(a.resume_step, "auto");
  EXPECT_TRUE(a.in_place);
  EXPECT_FALSE(a.join_in_place);
  EXPECT_FALSE(a.tp_size.has_value());
  EXPECT_EQ(a.profile_out, "");
  const std::map<std::string, std::string> want = {
      {"PATH", "/bin"},
      {"OMP_NUM_THREADS", "1"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29500"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"VARUNA_JOB_ID", "7"},
      {"VARUNA_JOB_NAME", "gpt"},
      {"VARUNA_GENERATION", "3"},
      {"VARUNA_JOB_SPEC", "/var/lib/varuna/jobs/7/gen3/job.yaml"},
      {"VARUNA_NODE", "node1"},
      {"VARUNA_NODE_ADDR", "10.0.0.2"},
      {"VARUNA_RESUME_STEP", "auto"},
      {kProgressFileEnv, "/p"},
  };
  EXPECT_EQ(p.env, want);
}

TEST(LaunchContractTest, PipelinesJoinersProfilesAndTensorParallel) {
  LaunchContract c = TwoByTwo();
  c.stage_to_rank_map.clear();
  c.pipelines = "0,3,6:4;0,6:4";
  c.join_in_place = true;
  c.tp_size = 2;
  c.profile = true;
  const RankProcess p = RankContract(c, 0, 0, "/p", {{"OMP_NUM_THREADS", "8"}});
  ASSERT_OK_AND_ASSIGN(WorkerArgs a, ParseWorkerArgs(p.argv));
  EXPECT_EQ(a.pipelines, "0,3,6:4;0,6:4");
  EXPECT_FALSE(a.stage_to_rank_map.has_value());
  EXPECT_FALSE(a.per_replica_batch.has_value());  // each pipeline's share is in the text
  EXPECT_TRUE(a.join_in_place);
  EXPECT_FALSE(a.resume_step.has_value());  // a joiner takes its state from live ranks
  EXPECT_EQ(a.tp_size, 2);
  EXPECT_EQ(a.profile_out, "/var/lib/varuna/jobs/7/gen3/profile.json");
  EXPECT_EQ(p.env.at("OMP_NUM_THREADS"), "8");  // the request's own value stands
  EXPECT_EQ(p.env.at("VARUNA_PIPELINES"), "0,3,6:4;0,6:4");
}

TEST(LaunchContractTest, AnEntrypointGetsThePlanInItsEnvironment) {
  LaunchContract c = TwoByTwo();
  c.entrypoint = {"python3", "train.py"};
  c.tp_size = 2;
  const RankProcess p = RankContract(c, 1, 1, "/p", {});
  EXPECT_EQ(p.argv, (std::vector<std::string>{"python3", "train.py", "--rank=1", "--local_rank=1",
                                              "--stage_to_rank_map=0,2;1,3;", "--chunk_size=2",
                                              "--batch-size=12"}));
  EXPECT_EQ(p.env.at("VARUNA_SCHEDULE"), "1f1b");
  EXPECT_EQ(p.env.at("VARUNA_STAGE_BOUNDARIES"), "0,3,6");
  EXPECT_EQ(p.env.at("VARUNA_TP_SIZE"), "2");
}

TEST(LaunchContractTest, ARegroupSetsTorchrunsVariablesForTheNewGeneration) {
  const auto env = RegroupEnvironment(6, 5, "10.0.0.9", 29600, 4);
  const std::map<std::string, std::string> want = {
      {"WORLD_SIZE", "6"},         {"RANK", "5"},
      {"MASTER_ADDR", "10.0.0.9"}, {"MASTER_PORT", "29600"},
      {"VARUNA_GENERATION", "4"},  {"TORCHELASTIC_RESTART_COUNT", "3"}};
  EXPECT_EQ(env, want);
}

}  // namespace
}  // namespace varuna

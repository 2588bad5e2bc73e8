#include "common/launch/slurm_env.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::StatusIs;

EnvGetter Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(SlurmEnvTest, FirstHostOfAHostList) {
  EXPECT_EQ(*FirstSlurmHost("node[1-3]"), "node1");
  EXPECT_EQ(*FirstSlurmHost("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(*FirstSlurmHost("login2,node[1-3]"), "login2");
  EXPECT_EQ(*FirstSlurmHost("rack[1-2]-n[3-4]"), "rack1-n3");
  EXPECT_EQ(*FirstSlurmHost("single"), "single");
  EXPECT_THAT(FirstSlurmHost("").status(), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(FirstSlurmHost("node[1-3").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unclosed"));
  EXPECT_THAT(FirstSlurmHost("node[a-b]").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "does not start with a number"));
}

TEST(SlurmEnvTest, TasksPerNode) {
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1", 0), 2);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1", 2), 2);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1", 3), 1);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1", 4), std::nullopt);
  EXPECT_EQ(SlurmTasksOnNode("x(2", 0), std::nullopt);
}

TEST(SlurmEnvTest, SlurmStandsInForTorchrun) {
  // An srun step of 8 tasks on gpu[03-06] inside a job allocated more nodes.
  const std::map<std::string, std::string> slurm = {{"SLURM_JOB_ID", "123456"},
                                                    {"SLURM_STEP_ID", "0"},
                                                    {"SLURM_PROCID", "5"},
                                                    {"SLURM_NTASKS", "8"},
                                                    {"SLURM_STEP_NUM_TASKS", "8"},
                                                    {"SLURM_LOCALID", "1"},
                                                    {"SLURM_NODEID", "2"},
                                                    {"SLURM_NODELIST", "gpu[01-06]"},
                                                    {"SLURM_STEP_NODELIST", "gpu[03-06]"},
                                                    {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"},
                                                    {"SLURM_TASKS_PER_NODE", "1(x6)"}};
  EnvGetter env = WithSlurmFallback(Env(slurm));
  EXPECT_EQ(env("RANK"), "5");
  EXPECT_EQ(env("WORLD_SIZE"), "8");
  EXPECT_EQ(env("LOCAL_RANK"), "1");
  EXPECT_EQ(env("NODE_RANK"), "2");
  EXPECT_EQ(env("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(env("MASTER_ADDR"), "gpu03");
  EXPECT_EQ(env("MASTER_PORT"), "18456");  // 15000 + the job id's last four digits
  EXPECT_EQ(env("OTHER"), std::nullopt);
  // torchrun's variables win (srun torchrun ..., or an agent's launch).
  auto both = slurm;
  both["RANK"] = "0";
  both["MASTER_PORT"] = "29500";
  env = WithSlurmFallback(Env(both));
  EXPECT_EQ(env("RANK"), "0");
  EXPECT_EQ(env("MASTER_PORT"), "29500");
  EXPECT_EQ(env("WORLD_SIZE"), "8");
  // Not a Slurm task: nothing is made up. A batch script (no step) is not one either.
  env = WithSlurmFallback(Env({{"SLURM_NTASKS", "8"}}));
  EXPECT_EQ(env("WORLD_SIZE"), std::nullopt);
  env =
      WithSlurmFallback(Env({{"SLURM_JOB_ID", "7"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}));
  EXPECT_EQ(env("WORLD_SIZE"), std::nullopt);
  EXPECT_FALSE(UnderSlurm(Env({{"SLURM_JOB_ID", "1"}})));
}

}  // namespace
}  // namespace varuna

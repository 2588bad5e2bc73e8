// Configuration files as operators write them: hostile ones are errors naming the key, the
// stragglers and slurm blocks are read and checked, and the examples in deploy/ load as shipped.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manager/manager_config.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/sec_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

TEST(ConfigFileTest, HostileConfigFilesAreErrorsNamingTheKey) {
  const std::string dir = MakeTempDir();
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/c.yaml", std::ios::trunc) << text;
    return dir + "/c.yaml";
  };
  ManagerConfig m;
  AgentConfig a;
  EXPECT_THAT(LoadManagerConfigFile(write("? [a, b]\n: 1\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a plain name"));
  EXPECT_THAT(LoadAgentConfigFile(write("? [a, b]\n: 1\n"), &a),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a plain name"));
  EXPECT_THAT(LoadManagerConfigFile(write("heartbeat_period_s: .inf\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "heartbeat_period_s"));
  EXPECT_THAT(LoadAgentConfigFile(write("labels: [1, 2]\n"), &a),
              StatusIs(absl::StatusCode::kInvalidArgument, "labels"));
  EXPECT_THAT(LoadManagerConfigFile(write("listen: a\nlisten: b\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "given twice"));
  EXPECT_THAT(LoadAgentConfigFile(write("slots: 99999999999\n"), &a),
              StatusIs(absl::StatusCode::kInvalidArgument, "slots"));
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(LoadManagerConfigFile(fifo, &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "regular file"));
  std::filesystem::remove_all(dir);
}

// The stragglers: block gives the defaults of jobs' unset stragglers: fields; each key it
// leaves out keeps its built-in default, and Validate() checks every field.
TEST(ConfigFileTest, StragglersBlockIsReadAndChecked) {
  const std::string dir = MakeTempDir();
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/c.yaml", std::ios::trunc) << text;
    return dir + "/c.yaml";
  };
  {
    ManagerConfig m;
    m.state_dir = dir;
    EXPECT_THAT(m.Validate(), IsOk());  // the built-in defaults are valid
    EXPECT_EQ(m.stragglers.policy, "auto");
    EXPECT_EQ(m.stragglers.slow_below, 0.7);
    EXPECT_EQ(m.stragglers.window_steps, 5);
    EXPECT_EQ(m.stragglers.min_gain, 0.05);
    EXPECT_EQ(m.stragglers.probation_s, 120);
    EXPECT_EQ(m.stragglers.recovered_above, 0.9);
  }
  {
    ManagerConfig m;
    ASSERT_THAT(LoadManagerConfigFile(write("state_dir: /tmp/x\n"
                                            "stragglers: {policy: report, slow_below: 0.6, "
                                            "window_steps: 10, min_gain: 0, probation_s: 600, "
                                            "recovered_above: 0.85}\n"),
                                      &m),
                IsOk());
    EXPECT_EQ(m.stragglers.policy, "report");
    EXPECT_EQ(m.stragglers.slow_below, 0.6);
    EXPECT_EQ(m.stragglers.window_steps, 10);
    EXPECT_EQ(m.stragglers.min_gain, 0);
    EXPECT_EQ(m.stragglers.probation_s, 600);
    EXPECT_EQ(m.stragglers.recovered_above, 0.85);
    EXPECT_THAT(m.Validate(), IsOk());
  }
  {
    ManagerConfig m;  // a partial block keeps the other defaults
    ASSERT_THAT(
        LoadManagerConfigFile(write("state_dir: /tmp/x\nstragglers:\n  policy: 'off'\n"), &m),
        IsOk());
    EXPECT_EQ(m.stragglers.policy, "off");
    EXPECT_EQ(m.stragglers.window_steps, 5);
    EXPECT_THAT(m.Validate(), IsOk());
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{slow_below: 1.5}", "manager config stragglers.slow_below"},
      {"{slow_below: 0}", "manager config stragglers.slow_below"},
      {"{window_steps: 1}", "manager config stragglers.window_steps"},
      {"{min_gain: -0.5}", "manager config stragglers.min_gain"},
      {"{probation_s: .nan}", "manager config stragglers.probation_s"},
      {"{recovered_above: 0.7}", "manager config stragglers.recovered_above (0.7) must be"},
      {"{policy: maybe}", "stragglers.policy must be auto, report or off, not 'maybe'"},
      {"{policy: ''}", "manager config stragglers.policy"},
  };
  for (const auto& [block, needle] : bad) {
    ManagerConfig m;
    ASSERT_THAT(LoadManagerConfigFile(write("state_dir: /tmp/x\nstragglers: " + block + "\n"), &m),
                IsOk())
        << block;
    EXPECT_THAT(m.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, needle)) << block;
  }
  ManagerConfig m;
  EXPECT_THAT(LoadManagerConfigFile(write("stragglers: {speed: 1}\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'stragglers.speed'"));
  EXPECT_THAT(LoadManagerConfigFile(write("stragglers: [auto]\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "'stragglers' must be a mapping"));
  EXPECT_THAT(LoadManagerConfigFile(write("stragglers: {window_steps: 2.5}\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "stragglers.window_steps"));
  EXPECT_THAT(
      LoadManagerConfigFile(write("straglers: {}\n"), &m),
      StatusIs(absl::StatusCode::kInvalidArgument, "stragglers, slurm, sharing, etcd"));  // known
  EXPECT_THAT(LoadManagerConfigFile(write("sharing: {clases: [high]}\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'sharing.clases'"));
  EXPECT_THAT(
      LoadManagerConfigFile(write("sharing: {users: {bob: {quota: 2}}}\n"), &m),
      StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'sharing.users.bob.quota'"));
  ManagerConfig shared;
  shared.state_dir = "/tmp/x";
  ASSERT_TRUE(LoadManagerConfigFile(
                  write("sharing: {classes: [urgent, high, normal, low], users: {bob: {weight: "
                        "2}}}\n"),
                  &shared)
                  .ok());
  EXPECT_TRUE(shared.sharing.enabled);
  EXPECT_EQ(shared.sharing.ClassRank("urgent"), 0);
  EXPECT_EQ(shared.sharing.users.at("bob").weight, 2);
  EXPECT_EQ(shared.job_options().priority_classes.size(), 4u);
  shared.sharing.classes = {"low", "normal", "high"};
  EXPECT_THAT(shared.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "in that order"));
  std::filesystem::remove_all(dir);
}

TEST(ConfigFileTest, SlurmBlockIsReadAndChecked) {
  const std::string dir = ::testing::TempDir() + "/slurm_cfg";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) {
    const std::string path = dir + "/c.yaml";
    std::ofstream(path) << text;
    return path;
  };
  ManagerConfig m;
  ASSERT_THAT(LoadManagerConfigFile(
                  write("state_dir: /tmp/x\nslurm:\n  partition: gpu\n  max_nodes: 4\n"
                        "  agent_command: /opt/varuna-agent --slots 8\n  slots_per_node: 8\n"
                        "  sbatch_args: [--gres=gpu:8, --constraint=a100]\n  poll_s: 2.5\n"),
                  &m),
              IsOk());
  EXPECT_TRUE(m.slurm.enabled());
  EXPECT_EQ(m.slurm.max_nodes, 4);
  EXPECT_EQ(m.slurm.sbatch_args.size(), 2u);
  EXPECT_EQ(m.slurm.poll_period, absl::Milliseconds(2500));
  EXPECT_THAT(m.Validate(), IsOk());
  ManagerConfig none;
  ASSERT_THAT(LoadManagerConfigFile(write("state_dir: /tmp/x\nslurm: {partition: gpu}\n"), &none),
              IsOk());
  EXPECT_THAT(none.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "manager config slurm: max_nodes must be >= 1"));
  EXPECT_THAT(LoadManagerConfigFile(write("slurm: {partion: gpu}\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'slurm.partion'"));
  EXPECT_THAT(LoadManagerConfigFile(write("slurm: {sbatch_args: --gres=gpu:8}\n"), &m),
              StatusIs(absl::StatusCode::kInvalidArgument, "slurm.sbatch_args"));
  std::filesystem::remove_all(dir);
}

// The example configs in deploy/ list every key; they must load as they are.
TEST(DeployConfigTest, ExampleConfigsLoad) {
  ManagerConfig m;
  EXPECT_THAT(
      LoadManagerConfigFile(absl::StrCat(VARUNA_SOURCE_DIR, "/deploy/config/manager.yaml"), &m),
      IsOk());
  EXPECT_EQ(m.max_morphs, 20);
  EXPECT_EQ(m.scale_up_delay, absl::Seconds(10));
  EXPECT_EQ(m.stragglers.policy, "auto");
  EXPECT_EQ(m.stragglers.window_steps, 5);
  AgentConfig a;
  EXPECT_THAT(LoadAgentConfigFile(absl::StrCat(VARUNA_SOURCE_DIR, "/deploy/config/agent.yaml"), &a),
              IsOk());
  EXPECT_EQ(a.notice_poll_period, absl::Seconds(1));
}

}  // namespace
}  // namespace varuna

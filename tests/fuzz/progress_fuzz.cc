// The progress protocol as the agent reads it: what a job's own program writes to its
// progress file (VARUNA_PROGRESS_FILE) is the least trusted input of the system (issue 23: step
// lines with long per-stage lists once pushed every heartbeat past the request limit and
// wedged the node). An input is up to 16 parts separated by "--8<--" lines, appended in turn to
// rank 0's and rank 1's progress files of one launched job (a fake launcher), each followed by
// the agent's Tick and a heartbeat. Besides never crashing: every heartbeat stays within
// kMaxHeartbeatBytes (Note [Heartbeat budget] in agent/heartbeat_report.cc), whatever was written.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_launcher.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = varuna::fuzz::ScratchDir() + "/progress";
  std::filesystem::remove_all(dir);
  varuna::AgentConfig c;
  c.name = "a";
  c.manager = "127.0.0.1:1";
  c.work_dir = dir;
  c.slots = 2;
  varuna::testing::FakeClock clock;
  varuna::testing::FakeLauncher launcher;
  varuna::Agent agent(c, &clock, &launcher);
  varuna::v1::LaunchRequest launch;
  launch.set_job_id("j");
  launch.set_generation(1);
  launch.set_spec_yaml("x: 1");
  launch.set_world_size(2);
  launch.add_ranks()->set_rank(0);
  launch.add_ranks()->set_rank(1);
  if (!agent.Launch(launch).ok()) std::abort();
  const auto parts = varuna::fuzz::Split(data, size, 16);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string path = absl::StrCat(dir, "/jobs/j/gen1/progress.rank", i % 2);
    std::ofstream(path, std::ios::app | std::ios::binary) << parts[i];
    agent.Tick();
    const varuna::v1::HeartbeatRequest hb = agent.BuildHeartbeat();
    if (hb.ByteSizeLong() > varuna::kMaxHeartbeatBytes) std::abort();
    clock.Advance(absl::Seconds(1));
  }
  return 0;
}

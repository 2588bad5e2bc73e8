// RealProcessLauncher's control FIFO with real processes: the command reaches a worker that
// listens (AgentCommandListener, the worker's end), and says so when nothing listens.

#include "agent/process_launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/launch/worker_channel.h"
#include "common/launch/worker_protocol.h"
#include "tests/testing/eventually.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::Eventually;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

class ProcessLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/launcher_test_", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Starts `sleep 60` with a control FIFO; returns its pid.
  int StartSleeper() {
    ProcessSpec spec;
    spec.argv = {"/bin/sleep", "60"};
    spec.env = {{"PATH", "/usr/bin:/bin"}};
    spec.log_path = dir_ + "/log";
    spec.control_fifo = fifo_;
    absl::StatusOr<int> pid = launcher_.Launch(spec);
    EXPECT_THAT(pid, IsOk());
    return pid.ok() ? *pid : -1;
  }
  void KillAndReap(int pid) {
    ASSERT_THAT(launcher_.Signal(pid, SIGKILL), IsOk());
    ASSERT_TRUE(Eventually([&] { return !launcher_.Reap().empty(); }));
  }

  std::string dir_;
  std::string fifo_ = "";
  RealProcessLauncher launcher_;
};

TEST_F(ProcessLauncherTest, CommandsReachAListeningWorkerAndFailFastOtherwise) {
  fifo_ = dir_ + "/control.rank0";
  std::ofstream(fifo_) << "left by the job";  // replaced by a fresh FIFO at launch
  const int pid = StartSleeper();
  struct stat st {};
  ASSERT_EQ(stat(fifo_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  v1::AgentCommand stop;
  stop.mutable_stop();
  const std::string line = *SerializeAgentCommand(stop);

  // `sleep` never opens it: the agent learns at once and signals instead.
  EXPECT_THAT(launcher_.SendCommand(pid, line),
              StatusIs(absl::StatusCode::kUnavailable, "nothing reads it"));

  // The worker's end, as varuna-worker holds it.
  std::atomic<int> stops{0};
  ASSERT_OK_AND_ASSIGN(auto listener,
                       AgentCommandListener::Start(fifo_, 0, [&](const v1::AgentCommand& c) {
                         if (c.has_stop()) ++stops;
                       }));
  ASSERT_THAT(launcher_.SendCommand(pid, line), IsOk());
  ASSERT_THAT(launcher_.SendCommand(pid, line), IsOk());
  EXPECT_TRUE(Eventually([&] { return stops.load() == 2; }));
  EXPECT_THAT(launcher_.SendCommand(pid, std::string(5000, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, "PIPE_BUF"));
  listener.reset();
  // The listener closed: nothing reads it again (no SIGPIPE for the agent).
  EXPECT_THAT(launcher_.SendCommand(pid, line), StatusIs(absl::StatusCode::kUnavailable, ""));

  KillAndReap(pid);
  EXPECT_FALSE(std::filesystem::exists(fifo_)) << "removed with its process";
  EXPECT_THAT(launcher_.SendCommand(pid, line),
              StatusIs(absl::StatusCode::kUnimplemented, "no control FIFO"));
}

TEST_F(ProcessLauncherTest, AFifoReplacedByTheJobIsNotWrittenTo) {
  fifo_ = dir_ + "/control.rank0";
  const int pid = StartSleeper();
  ASSERT_EQ(unlink(fifo_.c_str()), 0);
  std::ofstream(fifo_) << "";
  EXPECT_THAT(launcher_.SendCommand(pid, "{\"stop\":{}}"),
              StatusIs(absl::StatusCode::kUnavailable, "not a FIFO"));
  EXPECT_EQ(std::filesystem::file_size(fifo_), 0u);
  ASSERT_EQ(unlink(fifo_.c_str()), 0);
  ASSERT_EQ(symlink("/dev/null", fifo_.c_str()), 0);
  EXPECT_THAT(launcher_.SendCommand(pid, "{\"stop\":{}}"),
              StatusIs(absl::StatusCode::kUnavailable, ""));
  KillAndReap(pid);
}

TEST_F(ProcessLauncherTest, WithoutAControlFifoThereIsNoChannel) {
  const int pid = StartSleeper();
  EXPECT_THAT(launcher_.SendCommand(pid, "{\"stop\":{}}"),
              StatusIs(absl::StatusCode::kUnimplemented, ""));
  KillAndReap(pid);
}

}  // namespace
}  // namespace varuna

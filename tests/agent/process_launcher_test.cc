// RealProcessLauncher's control FIFO with real processes: the command reaches a worker that
// listens (AgentCommandListener, the worker's end), and says so when nothing listens.

#include "agent/process_launcher.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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

// Note [Worker user] in agent/launch_request.h: run as root, the launcher switches to the worker
// user (and gives it the generation's directory and FIFO); root itself only when allowed.
TEST_F(ProcessLauncherTest, RunsWorkersAsTheWorkerUserAndRootOnlyWhenAllowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  const struct passwd* pw = getpwnam("varuna");
  if (pw == nullptr) GTEST_SKIP() << "no user 'varuna' (scripts/install_deps.sh makes it)";
  const uid_t uid = pw->pw_uid;
  chmod(dir_.c_str(), 0755);  // the log and the owned dir live here
  const std::string gen = dir_ + "/gen1";
  std::filesystem::create_directories(gen);
  fifo_ = gen + "/control.rank0";
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "id -u; echo $HOME $USER; touch progress"};
  spec.env = {{"PATH", "/usr/bin:/bin"}, {"USER", "root"}};
  spec.log_path = dir_ + "/log";
  spec.cwd = gen;
  spec.control_fifo = fifo_;
  spec.user = "varuna";
  spec.owned_paths = {gen};
  absl::StatusOr<int> pid = launcher_.Launch(spec);
  ASSERT_THAT(pid, IsOk());
  ASSERT_TRUE(Eventually([&] { return !launcher_.Reap().empty(); }));
  std::ifstream log(dir_ + "/log");
  std::string id, home_user;
  std::getline(log, id);
  std::getline(log, home_user);
  EXPECT_EQ(id, std::to_string(uid));
  EXPECT_EQ(home_user, absl::StrCat(pw->pw_dir, " varuna"));
  struct stat st {};
  ASSERT_EQ(stat((gen + "/progress").c_str(), &st), 0) << "the worker can write its directory";
  EXPECT_EQ(st.st_uid, uid);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "workers start with umask 077";

  spec.user = "root";
  EXPECT_THAT(launcher_.Launch(spec),
              StatusIs(absl::StatusCode::kPermissionDenied, "--allow_root_workers"));
  spec.user = "no-such-user-here";
  EXPECT_THAT(launcher_.Launch(spec),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no-such-user-here"));
  spec.user = "root";
  spec.allow_root = true;
  spec.argv = {"/bin/true"};
  EXPECT_THAT(launcher_.Launch(spec), IsOk());
  ASSERT_TRUE(Eventually([&] { return !launcher_.Reap().empty(); }));
}

// Note [Launch failures] in agent/process_launcher.cc: a worker that cannot start says why in
// its log (the agent puts that line in the exit's reason): a working directory it cannot
// enter, a program it cannot run.
TEST_F(ProcessLauncherTest, AStartThatFailsSaysWhyInTheLog) {
  auto run = [&](ProcessSpec spec) {
    spec.env = {{"PATH", "/usr/bin:/bin"}};
    spec.log_path = dir_ + "/log";
    std::filesystem::remove(spec.log_path);
    absl::StatusOr<int> pid = launcher_.Launch(spec);
    EXPECT_THAT(pid, IsOk());
    std::vector<ProcessExit> exits;
    EXPECT_TRUE(Eventually([&] {
      exits = launcher_.Reap();
      return !exits.empty();
    }));
    std::ifstream in(spec.log_path);
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return std::make_pair(exits.empty() ? -1 : exits[0].exit_code, log);
  };
  ProcessSpec no_dir;
  no_dir.argv = {"/bin/true"};
  no_dir.cwd = dir_ + "/missing";
  auto [code, log] = run(no_dir);
  EXPECT_EQ(code, 126);
  EXPECT_THAT(log, ::testing::HasSubstr("cannot enter the working directory " + dir_ +
                                        "/missing: No such file or directory"));
  // Executable, but its interpreter is missing: only execve finds out.
  const std::string script = dir_ + "/bad-interpreter.sh";
  std::ofstream(script) << "#!/nonexistent/sh\n";
  chmod(script.c_str(), 0755);
  ProcessSpec no_exec;
  no_exec.argv = {script};
  std::tie(code, log) = run(no_exec);
  EXPECT_EQ(code, 127);
  EXPECT_THAT(log, ::testing::HasSubstr("cannot run " + script + ": No such file or directory"));
}

}  // namespace
}  // namespace varuna

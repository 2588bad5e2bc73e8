// RealProcessLauncher with real processes: its control pipe (the command reaches a worker that
// listens, AgentCommandListener being the worker's end, and says so when nothing listens), the
// worker user, and the reasons a start that fails writes.

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

  // Starts `sleep 60` (with a control pipe unless `pipe` is false); returns its pid.
  int StartSleeper(bool pipe = true) {
    ProcessSpec spec;
    spec.argv = {"/bin/sleep", "60"};
    spec.env = {{"PATH", "/usr/bin:/bin"}};
    spec.log_path = dir_ + "/log";
    spec.control_pipe = pipe;
    absl::StatusOr<int> pid = launcher_.Launch(spec);
    EXPECT_THAT(pid, IsOk());
    if (!pid.ok()) return -1;
    // Until exec the child's descriptors are the agent's.
    EXPECT_TRUE(Eventually([&] {
      std::error_code ec;
      return std::filesystem::read_symlink(absl::StrCat("/proc/", *pid, "/exe"), ec).filename() ==
             "sleep";
    }));
    return *pid;
  }
  void KillAndReap(int pid) {
    ASSERT_THAT(launcher_.Signal(pid, SIGKILL), IsOk());
    ASSERT_TRUE(Eventually([&] { return !launcher_.Reap().empty(); }));
  }

  std::string dir_;
  RealProcessLauncher launcher_;
};

TEST_F(ProcessLauncherTest, CommandsReachAListeningWorkerAndFailFastOtherwise) {
  const int pid = StartSleeper();
  // The read end is the child's file descriptor 3, named in its environment.
  const std::string fd3 = absl::StrCat("/proc/", pid, "/fd/", kControlFd);
  struct stat st {};
  ASSERT_EQ(stat(fd3.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  std::ifstream environ(absl::StrCat("/proc/", pid, "/environ"));
  std::string env((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
  EXPECT_THAT(env, ::testing::HasSubstr(absl::StrCat(kControlFdEnv, "=", kControlFd)));
  v1::AgentCommand stop;
  stop.mutable_stop();
  const std::string line = *SerializeAgentCommand(stop);

  // `sleep` never reads it: the agent learns at once and signals instead.
  EXPECT_FALSE(launcher_.Listening(pid));
  EXPECT_THAT(launcher_.SendCommand(pid, line),
              StatusIs(absl::StatusCode::kUnavailable, "nothing reads it"));

  // The worker's end, as varuna-worker holds it (here through /proc, as root can).
  std::atomic<int> stops{0};
  ASSERT_OK_AND_ASSIGN(auto listener,
                       AgentCommandListener::Adopt(open(fd3.c_str(), O_RDONLY | O_NONBLOCK), 0,
                                                   [&](const v1::AgentCommand& c) {
                                                     if (c.has_stop()) ++stops;
                                                   }));
  ASSERT_TRUE(Eventually([&] { return launcher_.Listening(pid); })) << "the first line taken";
  ASSERT_THAT(launcher_.SendCommand(pid, line), IsOk());
  ASSERT_THAT(launcher_.SendCommand(pid, line), IsOk());
  EXPECT_TRUE(Eventually([&] { return stops.load() == 2; }));
  EXPECT_EQ(listener->handled(), 2) << "the agent's empty first line is no command";
  EXPECT_THAT(launcher_.SendCommand(pid, std::string(5000, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, "PIPE_BUF"));
  listener.reset();

  KillAndReap(pid);
  EXPECT_THAT(launcher_.SendCommand(pid, line),
              StatusIs(absl::StatusCode::kUnimplemented, "no control pipe"));
}

// No path in the job's directory reaches a worker's commands (Note [Worker protocol] in
// common/launch/worker_protocol.cc).
TEST_F(ProcessLauncherTest, TheControlChannelIsNoPathTheJobCanOpen) {
  const int pid = StartSleeper();
  std::ifstream environ(absl::StrCat("/proc/", pid, "/environ"));
  std::string env((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
  EXPECT_THAT(env, ::testing::Not(::testing::HasSubstr(kControlFifoEnv)));
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_FALSE(std::filesystem::is_fifo(e.path())) << e.path();
  }
  KillAndReap(pid);
}

TEST_F(ProcessLauncherTest, AFullPipeIsReportedNotWaitedOn) {
  const int pid = StartSleeper();
  const std::string fd3 = absl::StrCat("/proc/", pid, "/fd/", kControlFd);
  // Take the first line by hand, then never read again.
  const int reader = open(fd3.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  char c;
  ASSERT_EQ(read(reader, &c, 1), 1);
  ASSERT_TRUE(launcher_.Listening(pid));
  const std::string line(4000, ' ');  // a valid size; the content does not matter here
  absl::Status st;
  for (int i = 0; i < 100 && st.ok(); ++i) st = launcher_.SendCommand(pid, line);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "full"));
  close(reader);
  KillAndReap(pid);
}

TEST_F(ProcessLauncherTest, WithoutAControlPipeThereIsNoChannel) {
  const int pid = StartSleeper(/*pipe=*/false);
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
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "id -u; echo $HOME $USER; touch progress"};
  spec.env = {{"PATH", "/usr/bin:/bin"}, {"USER", "root"}};
  spec.log_path = dir_ + "/log";
  spec.cwd = gen;
  spec.control_pipe = true;
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

// What the agent asks at start (CheckWorkersCanStart in agent/main.cc): can the worker user
// enter the work directory and run the worker binary?
TEST_F(ProcessLauncherTest, CheckUserCanUseNamesTheUserAndThePath) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  chmod(dir_.c_str(), 0755);
  const std::string open_dir = dir_ + "/open", private_dir = dir_ + "/private";
  std::filesystem::create_directories(open_dir + "/work");
  std::filesystem::create_directories(private_dir + "/work");
  chmod(private_dir.c_str(), 0700);
  ASSERT_OK_AND_ASSIGN(std::optional<WorkerIdentity> tenant,
                       ResolveWorkerUser("#1900000123", false));
  EXPECT_THAT(CheckUserCanUse(*tenant, open_dir + "/work", "/bin/true"), IsOk());
  EXPECT_THAT(CheckUserCanUse(*tenant, private_dir + "/work", "/bin/true"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "the worker user uid1900000123 (uid 1900000123) cannot enter " +
                           private_dir + "/work: Permission denied"));
  const std::string program = private_dir + "/varuna-worker";
  std::ofstream(program) << "#!/bin/sh\n";
  chmod(program.c_str(), 0755);
  EXPECT_THAT(CheckUserCanUse(*tenant, open_dir + "/work", program),
              StatusIs(absl::StatusCode::kPermissionDenied, "cannot run " + program));
}

// A tenant's uid (Note [Tenant uids] in common/launch/tenant_uid.cc) needs no passwd entry:
// gid = uid, no other groups, HOME the generation's directory it was given.
TEST_F(ProcessLauncherTest, ATenantUidRunsWithoutAPasswdEntry) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  chmod(dir_.c_str(), 0755);
  const std::string gen = dir_ + "/gen1";
  std::filesystem::create_directories(gen);
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "id -u; id -g; id -G; echo $HOME $USER; touch progress"};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.log_path = dir_ + "/log";
  spec.cwd = gen;
  spec.user = "#1900000123";
  spec.owned_paths = {gen};
  ASSERT_THAT(launcher_.Launch(spec), IsOk());
  ASSERT_TRUE(Eventually([&] { return !launcher_.Reap().empty(); }));
  std::ifstream log(dir_ + "/log");
  std::string uid, gid, groups, home_user;
  std::getline(log, uid);
  std::getline(log, gid);
  std::getline(log, groups);
  std::getline(log, home_user);
  EXPECT_EQ(uid, "1900000123");
  EXPECT_EQ(gid, "1900000123");
  EXPECT_EQ(groups, "1900000123");
  EXPECT_EQ(home_user, gen + " uid1900000123");
  struct stat st {};
  ASSERT_EQ(stat((gen + "/progress").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1900000123u);
  for (const char* bad : {"#0", "#x", "#"}) {
    spec.user = bad;
    EXPECT_THAT(launcher_.Launch(spec), StatusIs(absl::StatusCode::kInvalidArgument, "uid")) << bad;
  }
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

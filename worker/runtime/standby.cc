#include "worker/runtime/standby.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/launch/launch_args.h"
#include "common/launch/worker_channel.h"
#include "common/launch/worker_protocol.h"
#include "varuna/v1/worker.pb.h"
#include "worker/runtime/worker_main_lib.h"

extern char** environ;

namespace varuna {

// Note [Standby workers]: a morph's fresh worker (a replacement, a joiner) would pay a
// process start-up (LibTorch loads in about 0.7 CPU-s, more when several start on one
// machine) before its rendezvous. The agent keeps `--standby_workers` processes started
// ahead: each has loaded LibTorch and waits on its control pipe. A root agent's standbys wait
// as root, so one pool serves jobs of every Unix user (Note [Worker user] in
// agent/launch_request.h); they run nothing of a job's before they drop to its user. To use one,
// the agent writes the launch it stands in for (argv, the whole environment, directory, log, the
// credentials to take) to the standby's start file (StandbyStartPath: in a directory only the
// agent's user can enter, since it holds the job's environment and decides the credentials), gives
// the generation's directory and the log to the job's user, and sends a StartCommand. The
// standby takes no other start file (once it is the job's user, that user's processes can
// reach its pipe through /proc), and deletes it once read. The standby closes its
// listener, takes the credentials (as the launcher's child does before exec: groups, gid, uid; then
// the parent-death signal again, which a change of credentials clears), takes the environment (its
// control pipe stays its own), changes directory, appends its output to the rank's log and runs
// RunWorker as a launched worker would. Its PID is the worker's. The agent fills free slots that
// stayed free for 2 s with new standbys (not while a relaunch is about to start processes of its
// own); with 0 there are none and launches start processes.
namespace {

absl::Status Become(const v1::StandbyCredentials& c, pid_t parent) {
  const std::vector<gid_t> groups(c.groups().begin(), c.groups().end());
  if (setgroups(groups.size(), groups.data()) != 0 || setgid(c.gid()) != 0 ||
      setuid(c.uid()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("standby: cannot become uid ", c.uid(), " gid ",
                                                    c.gid(), ": ", std::strerror(errno)));
  }
  if (c.uid() != 0 && setuid(0) == 0) {
    return absl::InternalError("standby: root could be regained after dropping it");
  }
  // As a process exec'd by the launcher would be: readable /proc files, and dying with the
  // agent (credential changes clear both).
  prctl(PR_SET_DUMPABLE, 1);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return absl::AbortedError("standby: the agent is gone");
  return absl::OkStatus();
}

}  // namespace

absl::Status RunStandby() {
  const pid_t parent = getppid();
  const std::optional<std::string> dir = GetEnv(kStandbyDirEnv);
  const std::optional<std::string> fd_text = GetEnv(kControlFdEnv);
  int fd = -1;
  if (!dir || dir->empty() || !fd_text || !absl::SimpleAtoi(*fd_text, &fd)) {
    return absl::FailedPreconditionError(absl::StrCat("--standby needs ", kStandbyDirEnv, " and ",
                                                      kControlFdEnv,
                                                      " (the agent starts standbys)"));
  }
  std::mutex mu;
  std::optional<std::string> spec_path;
  {
    // A copy: the pipe itself stays open for RunWorker, and what the agent sends between the
    // two listeners waits in it.
    ASSIGN_OR_RETURN(auto listener,
                     AgentCommandListener::Adopt(dup(fd), 0, [&](const v1::AgentCommand& c) {
                       if (c.kind_case() != v1::AgentCommand::kStart) return;
                       std::lock_guard<std::mutex> l(mu);
                       spec_path = c.start().spec_path();
                     }));
    LOG(INFO) << "standby worker ready (pid " << getpid() << ")";
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (spec_path) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }  // the listener closes its copy: RunWorker reads the pipe again
  // Only the agent's own start file for this process (Note [Standby workers]): once this
  // process is the job's user, that user's processes can reach its pipe too.
  const std::string expected = StandbyStartPath(*dir, getpid());
  if (*spec_path != expected) {
    return absl::PermissionDeniedError(absl::StrCat("standby: start file '", *spec_path,
                                                    "' refused: only ", expected, " is taken"));
  }
  struct stat dir_st {};
  const std::string start_dir = expected.substr(0, expected.rfind('/'));
  if (lstat(start_dir.c_str(), &dir_st) != 0 || !S_ISDIR(dir_st.st_mode) ||
      dir_st.st_uid != geteuid() || (dir_st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("standby: ", start_dir, " must be a directory only this user can enter"));
  }
  absl::StatusOr<std::string> read = ReadRegularFile(expected, 1 << 20, "standby start file");
  unlink(expected.c_str());
  if (!read.ok()) return read.status();
  const std::string text = *std::move(read);
  v1::StandbyStart start;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  if (auto st = google::protobuf::util::JsonStringToMessage(text, &start, opts); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("standby start file ", expected, ": ", st.ToString()));
  }
  if (start.argv().empty()) return absl::InvalidArgumentError("standby start file: no argv");
  if (start.has_become()) RETURN_IF_ERROR(Become(start.become(), parent));
  if (!start.log_path().empty()) {
    const int fd = open(start.log_path().c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("standby: cannot open the log ", start.log_path()));
    }
    fflush(stdout);
    fflush(stderr);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  clearenv();
  for (const auto& [k, v] : start.env()) setenv(k.c_str(), v.c_str(), /*overwrite=*/1);
  setenv(kControlFdEnv, fd_text->c_str(), /*overwrite=*/1);
  if (!start.cwd().empty() && chdir(start.cwd().c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("standby: cannot enter ", start.cwd()));
  }
  std::vector<std::string> argv(start.argv().begin(), start.argv().end());
  LOG(INFO) << "standby worker pid " << getpid() << " starts as: " << absl::StrJoin(argv, " ");
  return RunWorker(argv);
}

}  // namespace varuna

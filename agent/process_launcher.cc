#include "agent/process_launcher.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/launch/worker_protocol.h"

namespace varuna {
namespace {

// `prefix`, the name of `err` and a newline to `fd`; async-signal-safe (a forked child).
void WriteReason(int fd, const std::string& prefix, int err) {
  (void)!write(fd, prefix.data(), prefix.size());
  const char* name = strerrordesc_np(err);
  if (name != nullptr) (void)!write(fd, name, strlen(name));
  (void)!write(fd, "\n", 1);
}

// Resolves argv[0] against PATH in the parent: only async-signal-safe calls after fork.
std::string ResolveProgram(const std::string& name, const std::map<std::string, std::string>& env) {
  if (name.find('/') != std::string::npos) return name;
  auto it = env.find("PATH");
  const std::string path = it != env.end() ? it->second : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The control pipe (Note [Worker protocol] in common/launch/worker_protocol.cc): `fds` its
// ends, the write end non-blocking with the agent's first (empty) line in it; `env` names the
// descriptor the child will find the read end at.
absl::Status MakeControlPipe(int fds[2], std::map<std::string, std::string>* env) {
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  (void)!write(fds[1], "\n", 1);
  (*env)[kControlFdEnv] = absl::StrCat(kControlFd);
  env->erase(kControlFifoEnv);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<WorkerIdentity>> ResolveWorkerUser(const std::string& user,
                                                                bool allow_root) {
  if (geteuid() != 0 || user.empty()) return std::nullopt;
  if (user[0] == '#') {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(user.substr(1), &uid) || uid == 0 || uid == static_cast<uint32_t>(-1)) {
      return absl::InvalidArgumentError(absl::StrCat("worker uid '", user, "' is not a user's"));
    }
    WorkerIdentity id;
    id.uid = uid;
    id.gid = uid;
    id.name = absl::StrCat("uid", uid);
    return std::optional<WorkerIdentity>(std::move(id));
  }
  struct passwd pw {};
  struct passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker user '", user,
                     "' does not exist on this machine: create it (useradd --system ", user,
                     "; scripts/install_deps.sh makes 'varuna'), or give the agent "
                     "another --worker_user"));
  }
  if (pw.pw_uid == 0 && !allow_root) {
    return absl::PermissionDeniedError(
        absl::StrCat("refusing to run workers as root ('", user,
                     "'): give the agent --allow_root_workers to allow it"));
  }
  WorkerIdentity id;
  id.uid = pw.pw_uid;
  id.gid = pw.pw_gid;
  id.name = pw.pw_name;
  id.home = pw.pw_dir;
  int n = 64;
  id.groups.resize(n);
  if (getgrouplist(pw.pw_name, pw.pw_gid, id.groups.data(), &n) < 0) {
    id.groups.resize(n);
    getgrouplist(pw.pw_name, pw.pw_gid, id.groups.data(), &n);
  }
  id.groups.resize(std::max(n, 0));
  return std::optional<WorkerIdentity>(std::move(id));
}

void SetUserEnvironment(const WorkerIdentity& id, const std::string& home,
                        std::map<std::string, std::string>* env) {
  (*env)["USER"] = (*env)["LOGNAME"] = id.name;
  (*env)["HOME"] = id.home.empty() ? home : id.home;
}

absl::Status GiveToUser(const WorkerIdentity& id, const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    if (lchown(p.c_str(), id.uid, id.gid) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot give ", p, " to ", id.name, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUserCanUse(const WorkerIdentity& id, const std::string& dir,
                             const std::string& program) {
  int answer[2];
  if (pipe2(answer, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(answer[0]);
    close(answer[1]);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {  // async-signal-safe calls only: [which, errno] to the parent
    int reply[2] = {0, 0};
    if (setgroups(id.groups.size(), id.groups.data()) != 0 || setgid(id.gid) != 0 ||
        setuid(id.uid) != 0) {
      reply[0] = 1;
    } else if (access(dir.c_str(), X_OK) != 0) {
      reply[0] = 2;
    } else if (access(program.c_str(), X_OK) != 0) {
      reply[0] = 3;
    }
    reply[1] = errno;
    (void)!write(answer[1], reply, sizeof(reply));
    _exit(0);
  }
  close(answer[1]);
  int reply[2] = {0, 0};
  const ssize_t n = read(answer[0], reply, sizeof(reply));
  close(answer[0]);
  waitpid(pid, nullptr, 0);
  if (n != static_cast<ssize_t>(sizeof(reply))) {
    return absl::InternalError(absl::StrCat("could not check what ", id.name, " can use"));
  }
  const std::string who = absl::StrCat("the worker user ", id.name, " (uid ", id.uid, ")");
  const char* why = std::strerror(reply[1]);
  switch (reply[0]) {
    case 1:
      return absl::PermissionDeniedError(absl::StrCat("cannot switch to ", who, ": ", why));
    case 2:
      return absl::PermissionDeniedError(absl::StrCat(who, " cannot enter ", dir, ": ", why));
    case 3:
      return absl::PermissionDeniedError(absl::StrCat(who, " cannot run ", program, ": ", why));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RealProcessLauncher::Launch(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty command");
  const std::string program = ResolveProgram(spec.argv[0], spec.env);
  if (program.empty() || access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("program '", spec.argv[0], "' not found or not executable"));
  }
  // The log is in a directory the job's own processes can write: never block on (or follow)
  // whatever they may have put there (common/base/safe_file.h).
  const int log_fd =
      open(spec.log_path.c_str(),
           O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, 0600);
  if (log_fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open log ", spec.log_path, ": ", std::strerror(errno)));
  }
  struct stat log_st {};
  if (fstat(log_fd, &log_st) != 0 || !S_ISREG(log_st.st_mode)) {
    close(log_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("log ", spec.log_path, " is not a regular file"));
  }
  fcntl(log_fd, F_SETFL, fcntl(log_fd, F_GETFL) & ~O_NONBLOCK);
  auto identity = ResolveWorkerUser(spec.user, spec.allow_root);
  if (!identity.ok()) {
    close(log_fd);
    return identity.status();
  }
  std::map<std::string, std::string> env = spec.env;
  if (*identity) {
    SetUserEnvironment(**identity, spec.owned_paths.empty() ? spec.cwd : spec.owned_paths[0], &env);
    if (absl::Status st = GiveToUser(**identity, spec.owned_paths); !st.ok()) {
      close(log_fd);
      return st;
    }
  }
  // The control pipe (Note [Worker protocol] in common/launch/worker_protocol.cc): the child
  // gets the read end as kControlFd; the agent keeps the write end and puts an empty line in,
  // which tells it when the worker listens. Without it the worker gets signals only.
  int control[2] = {-1, -1};
  if (spec.control_pipe) {
    if (absl::Status st = MakeControlPipe(control, &env); !st.ok()) {
      close(log_fd);
      return st;
    }
  }
  const auto close_control = [&] {
    for (int& fd : control) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  };
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const WorkerIdentity* as = *identity ? &**identity : nullptr;
  // Note [Launch failures]: between fork and exec only async-signal-safe calls, so each reason
  // is written here and the child adds the error's name; the manager reads the log's tail.
  const std::string user_name = as != nullptr ? as->name : std::string("the agent's user");
  const std::string no_user =
      absl::StrCat("varuna-agent: cannot switch to the worker user ", user_name, ": ");
  const std::string no_cwd = absl::StrCat("varuna-agent: the worker user ", user_name,
                                          " cannot enter the working directory ", spec.cwd, ": ");
  const std::string no_exec =
      absl::StrCat("varuna-agent: the worker user ", user_name, " cannot run ", program, ": ");

  absl::MutexLock lock(&mu_);
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    close_control();
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // Credentials first: changing them clears the parent-death signal set below.
    if (as != nullptr && (setgroups(as->groups.size(), as->groups.data()) != 0 ||
                          setgid(as->gid) != 0 || setuid(as->uid) != 0)) {
      WriteReason(log_fd, no_user, errno);
      _exit(126);
    }
    // What the job creates is its user's alone (a checkpoint directory's mode is the job's
    // business: docs/operations.md "Who workers run as").
    umask(077);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (control[0] == kControlFd) {
      fcntl(kControlFd, F_SETFD, 0);
    } else if (control[0] >= 0) {
      dup2(control[0], kControlFd);
    }
    if (!spec.cwd.empty() && chdir(spec.cwd.c_str()) != 0) {
      WriteReason(STDERR_FILENO, no_cwd, errno);
      _exit(126);
    }
    execve(program.c_str(), argv.data(), envp.data());
    const int exec_errno = errno;
    WriteReason(STDERR_FILENO, no_exec, exec_errno);
    _exit(exec_errno == ENOENT ? 127 : 126);
  }
  setpgid(pid, pid);  // also from the parent, so a signal right away reaches the group
  close(log_fd);
  if (control[0] >= 0) close(control[0]);
  live_.push_back(pid);
  if (control[1] >= 0) control_[pid] = Control{control[1], false};
  return static_cast<int>(pid);
}

absl::Status RealProcessLauncher::Signal(int pid, int sig) {
  if (kill(-pid, sig) != 0 && kill(pid, sig) != 0) {
    if (errno == ESRCH) return absl::OkStatus();  // already gone; Reap() will report it
    return absl::InternalError(absl::StrCat("kill(", pid, ", ", sig, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool RealProcessLauncher::ListeningLocked(Control& c) {
  if (!c.listening) {
    int unread = 0;
    c.listening = ioctl(c.fd, FIONREAD, &unread) == 0 && unread == 0;
  }
  return c.listening;
}

bool RealProcessLauncher::Listening(int pid) {
  absl::MutexLock lock(&mu_);
  auto it = control_.find(pid);
  return it != control_.end() && ListeningLocked(it->second);
}

absl::Status RealProcessLauncher::SendCommand(int pid, const std::string& line) {
  const std::string l = absl::StrCat(line, "\n");
  if (l.size() > PIPE_BUF) {
    return absl::InvalidArgumentError(
        absl::StrCat("command of ", l.size(), " bytes is over PIPE_BUF (", PIPE_BUF, ")"));
  }
  absl::MutexLock lock(&mu_);
  auto it = control_.find(pid);
  if (it == control_.end()) {
    return absl::UnimplementedError(absl::StrCat("process ", pid, " has no control pipe"));
  }
  // Until the worker took the first line it may never read (a program that ignores the
  // channel): the caller signals instead, as it would have to anyway.
  if (!ListeningLocked(it->second)) {
    return absl::UnavailableError(absl::StrCat("control pipe of ", pid, ": nothing reads it"));
  }
  // The reader may be gone: EPIPE, not a SIGPIPE that would end the agent. Blocked for this
  // thread only, and a pending one is taken before unblocking.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  const ssize_t n = write(it->second.fd, l.data(), l.size());
  const int err = errno;
  if (n < 0 && err == EPIPE) {
    const timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  if (n != static_cast<ssize_t>(l.size())) {  // PIPE_BUF bytes are written whole or not at all
    return absl::UnavailableError(
        absl::StrCat("control pipe of ", pid, ": ", err == EAGAIN ? "full" : std::strerror(err)));
  }
  return absl::OkStatus();
}

std::vector<ProcessExit> RealProcessLauncher::Reap() {
  std::vector<ProcessExit> exits;
  absl::MutexLock lock(&mu_);
  for (auto it = live_.begin(); it != live_.end();) {
    int status = 0;
    const pid_t r = waitpid(*it, &status, WNOHANG);
    if (r == *it) {
      ProcessExit e;
      e.pid = r;
      if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      } else {
        e.exit_code = WEXITSTATUS(status);
      }
      exits.push_back(e);
      // The worker's own children may outlive it; they share its process group.
      kill(-r, SIGKILL);
      ForgetControl(r);
      it = live_.erase(it);
    } else if (r < 0 && errno == ECHILD) {
      exits.push_back(ProcessExit{*it, 0, SIGKILL});
      ForgetControl(*it);
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  return exits;
}

void RealProcessLauncher::ForgetControl(int pid) {
  auto it = control_.find(pid);
  if (it == control_.end()) return;
  close(it->second.fd);
  control_.erase(it);
}

RealProcessLauncher::~RealProcessLauncher() {
  absl::MutexLock lock(&mu_);
  for (auto& [pid, c] : control_) close(c.fd);
}

}  // namespace varuna

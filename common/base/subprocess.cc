#include "common/base/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace varuna {
namespace {

std::string Describe(const std::vector<std::string>& argv) {
  std::string s = absl::StrJoin(argv, " ");
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s;
}

void CloseIf(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace

absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env, absl::Duration timeout,
    size_t max_output) {
  if (argv.empty() || argv[0].empty()) return absl::InvalidArgumentError("run: no command");
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    const std::string name(*e, eq == nullptr ? strlen(*e) : eq - *e);
    bool replaced = false;
    for (const auto& [k, v] : env) replaced = replaced || k == name;
    if (!replaced) env_strings.emplace_back(*e);
  }
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(exec_err, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int* fd : {&out[0], &out[1], &err[0], &err[1], &exec_err[0], &exec_err[1]}) CloseIf(fd);
    return absl::ResourceExhaustedError(absl::StrCat("run ", argv[0], ": pipe: ", strerror(e)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int* fd : {&out[0], &out[1], &err[0], &err[1], &exec_err[0], &exec_err[1]}) CloseIf(fd);
    return absl::ResourceExhaustedError(absl::StrCat("run ", argv[0], ": fork: ", strerror(e)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the manager blocks SIGTERM for sigwait
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execvpe(args[0], args.data(), envp.data());
    const int e = errno;
    ssize_t unused = write(exec_err[1], &e, sizeof(e));
    (void)unused;
    _exit(127);
  }
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  close(exec_err[1]);
  int child_errno = 0;
  ssize_t got;
  do {
    got = read(exec_err[0], &child_errno, sizeof(child_errno));
  } while (got < 0 && errno == EINTR);
  close(exec_err[0]);
  if (got == sizeof(child_errno)) {
    close(out[0]);
    close(err[0]);
    waitpid(pid, nullptr, 0);
    const std::string msg = absl::StrCat("cannot run ", argv[0], ": ", strerror(child_errno));
    if (child_errno == ENOENT) return absl::NotFoundError(msg);
    if (child_errno == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }

  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool timed_out = false;
  char buf[65536];
  while (open_fds > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int n = poll(fds, 2, ms);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && n > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t r = read(fds[i].fd, buf, sizeof(buf));
      if (r > 0) {
        const size_t room = max_output > sinks[i]->size() ? max_output - sinks[i]->size() : 0;
        sinks[i]->append(buf, std::min<size_t>(room, static_cast<size_t>(r)));
      } else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  // Output closed: the command is ending (or something it started holds the pipes: then the
  // deadline still applies to its exit).
  while (true) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (!timed_out && absl::Now() >= deadline) {
      timed_out = true;
      kill(-pid, SIGKILL);
    }
    usleep(10000);
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("'", Describe(argv), "' did not finish in ", absl::FormatDuration(timeout)));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace varuna

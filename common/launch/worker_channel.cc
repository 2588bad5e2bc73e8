#include "common/launch/worker_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/launch/worker_protocol.h"

namespace varuna {

absl::Status AppendWorkerEventTo(const std::string& path, v1::WorkerEvent event) {
  if (event.t() == 0) {
    event.set_t(
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  }
  absl::StatusOr<std::string> line = SerializeWorkerEvent(event);
  if (!line.ok()) return line.status();
  line->push_back('\n');
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open progress file ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || absl::StartsWith(path, "/proc/") ||
      absl::StartsWith(path, "/sys/") || absl::StartsWith(path, "/dev/")) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("progress file ", path, " is not a regular file of a filesystem"));
  }
  const ssize_t n = ::write(fd, line->data(), line->size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line->size())) {
    return absl::UnavailableError(absl::StrCat("short write to progress file ", path, ": ",
                                               n < 0 ? std::strerror(err) : "disk full?"));
  }
  return absl::OkStatus();
}

absl::Status AppendWorkerEvent(v1::WorkerEvent event) {
  const char* path = std::getenv(kProgressFileEnv);
  if (path == nullptr || *path == '\0') return absl::OkStatus();
  return AppendWorkerEventTo(path, std::move(event));
}

absl::StatusOr<std::unique_ptr<AgentCommandListener>> AgentCommandListener::Start(
    const std::string& path, int generation, Handler handler) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open control FIFO ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("control path ", path, " is not a FIFO"));
  }
  return Adopt(fd, generation, std::move(handler));
}

absl::StatusOr<std::unique_ptr<AgentCommandListener>> AgentCommandListener::Adopt(int fd,
                                                                                  int generation,
                                                                                  Handler handler) {
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    if (fd >= 0) ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("control channel (file descriptor ", fd, ") is not a pipe or FIFO"));
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  return std::unique_ptr<AgentCommandListener>(
      new AgentCommandListener(fd, wake[0], wake[1], generation, std::move(handler)));
}

AgentCommandListener::AgentCommandListener(int fifo_fd, int wake_read, int wake_write,
                                           int generation, Handler handler)
    : fifo_fd_(fifo_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      generation_(generation),
      handler_(std::move(handler)) {
  thread_ = std::thread([this] { Run(); });
}

AgentCommandListener::~AgentCommandListener() {
  const char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(wake_write_, &byte, 1);
  thread_.join();
  ::close(fifo_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

void AgentCommandListener::Run() {
  std::string pending;    // the start of a line whose newline has not arrived
  bool skipping = false;  // inside an over-long line: drop bytes up to its newline
  char buf[4096];
  for (;;) {
    pollfd fds[2] = {{fifo_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "control channel: poll: " << std::strerror(errno) << "; commands stop";
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & (POLLERR | POLLNVAL)) != 0) {
      LOG(ERROR) << "control channel: error; commands stop (signals still work)";
      return;
    }
    const ssize_t n = ::read(fifo_fd_, buf, sizeof(buf));
    if (n == 0) {  // a pipe whose writer is gone (a FIFO held read-write never ends)
      LOG(WARNING) << "control channel: the agent closed it; commands stop";
      return;
    }
    if (n < 0) continue;  // EAGAIN, EINTR
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\n') {
        if (skipping) continue;
        pending += buf[i];
        if (pending.size() > kMaxCommandLineBytes) {
          LOG(WARNING) << "control channel: a line over " << kMaxCommandLineBytes
                       << " bytes; skipped";
          pending.clear();
          skipping = true;
        }
        continue;
      }
      if (!skipping) HandleLine(pending);
      pending.clear();
      skipping = false;
    }
  }
}

void AgentCommandListener::HandleLine(const std::string& line) {
  if (line.empty() || line == "\r") return;  // the agent's first line (Note [Worker protocol])
  absl::StatusOr<v1::AgentCommand> command = ParseAgentCommand(line);
  if (!command.ok()) {
    LOG(WARNING) << "control channel: " << command.status().message() << "; line skipped";
    return;
  }
  const int generation = generation_.load();
  if (command->generation() != 0 && generation != 0 && command->generation() != generation) {
    LOG(WARNING) << "control channel: " << CommandKindName(*command) << " for generation "
                 << command->generation() << " ignored by generation " << generation;
    return;
  }
  ++handled_;
  handler_(*command);
}

}  // namespace varuna

#include "agent/preemption.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace {

int64_t ToUnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

// Note [Whose notice]: Azure's Scheduled Events list every event of the VM's availability
// set or scale set, for any of its VMs, and keep finished ones for a while. An event is this
// machine's only when its Resources name this VM and its EventStatus is not Completed or
// Canceled; otherwise one Spot eviction would drain every node of a scale set.
bool AzureEventIsMine(const YAML::Node& e, const std::vector<std::string>& vm_names) {
  auto status = YamlAs<std::string>(e["EventStatus"], "azure", "EventStatus");
  if (status.ok() && (*status == "Completed" || *status == "Canceled")) return false;
  if (!e["Resources"] || !e["Resources"].IsSequence()) return false;
  for (const auto& r : e["Resources"]) {
    auto name = YamlAs<std::string>(r, "azure", "Resources");
    if (!name.ok()) continue;
    for (const std::string& mine : vm_names) {
      if (!mine.empty() && absl::EqualsIgnoreCase(*name, mine)) return true;
    }
  }
  return false;
}

std::optional<v1::PreemptionNotice> ParseJsonReply(const YAML::Node& n,
                                                   const std::vector<std::string>& vm_names) {
  // Azure: a Preempt event (Spot eviction) for this VM that has not ended.
  if (n["Events"] && n["Events"].IsSequence()) {
    for (const auto& e : n["Events"]) {
      if (!e.IsMap()) continue;
      auto type = YamlAs<std::string>(e["EventType"], "azure", "EventType");
      if (!type.ok() || *type != "Preempt") continue;
      if (!AzureEventIsMine(e, vm_names)) continue;
      v1::PreemptionNotice notice;
      notice.set_source("azure");
      auto not_before = YamlAs<std::string>(e["NotBefore"], "azure", "NotBefore");
      absl::Time t;
      std::string err;
      if (not_before.ok() && absl::ParseTime("%a, %d %b %Y %H:%M:%S GMT", *not_before, &t, &err)) {
        notice.set_deadline_ms(ToUnixMs(t));
      }
      auto id = YamlAs<std::string>(e["EventId"], "azure", "EventId");
      notice.set_detail(absl::StrCat("Scheduled Event Preempt", id.ok() ? " " + *id : ""));
      return notice;
    }
    return std::nullopt;
  }
  // AWS: spot/instance-action.
  auto action = YamlAs<std::string>(n["action"], "aws", "action");
  if (action.ok() && (*action == "terminate" || *action == "stop" || *action == "hibernate")) {
    v1::PreemptionNotice notice;
    notice.set_source("aws");
    notice.set_detail(absl::StrCat("spot instance-action ", *action));
    auto time = YamlAs<std::string>(n["time"], "aws", "time");
    absl::Time t;
    std::string err;
    if (time.ok() && absl::ParseTime(absl::RFC3339_full, *time, &t, &err)) {
      notice.set_deadline_ms(ToUnixMs(t));
    }
    return notice;
  }
  return std::nullopt;
}

}  // namespace

std::optional<v1::PreemptionNotice> ParsePreemptionReply(int http_status, const std::string& body,
                                                         const std::vector<std::string>& vm_names) {
  if (http_status != 200) return std::nullopt;  // AWS answers 404 until there is a notice
  const std::string text(absl::StripAsciiWhitespace(body));
  if (absl::EqualsIgnoreCase(text, "TRUE")) {  // GCE instance/preempted
    v1::PreemptionNotice notice;
    notice.set_source("gce");
    notice.set_detail("instance/preempted is TRUE");
    return notice;
  }
  if (text.empty() || (text[0] != '{' && text[0] != '[')) return std::nullopt;
  auto n = ParseYaml(text, "preemption notice reply");
  if (!n.ok() || !n->IsMap()) return std::nullopt;
  try {  // Note [Parser boundary] (common/spec/submission.cc).
    return ParseJsonReply(*n, vm_names);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

absl::StatusOr<HttpReply> HttpGet(const std::string& url, absl::Duration timeout, int cancel_fd) {
  if (!absl::StartsWith(url, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("preemption_notice_url must start with http:// (got '", url, "')"));
  }
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string host = hostport, port = "80";
  if (const size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", hostport));
  }
  // One deadline for everything (connecting, sending, the whole reply): an endpoint that
  // accepts slowly or trickles a byte at a time cannot hold the poll longer than `timeout`,
  // and `cancel_fd` turning readable (the agent shutting down) ends it at once.
  const absl::Time deadline = absl::Now() + timeout;
  const int fd =
      socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    return absl::InternalError("socket() failed");
  }
  // Waits until fd is ready for `events`: OK, DeadlineExceeded, or Cancelled.
  auto wait = [&](short events) -> absl::Status {
    for (;;) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat("no complete reply from ", hostport,
                                                        " within ", absl::FormatDuration(timeout)));
      }
      pollfd fds[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
      const int n =
          poll(fds, cancel_fd >= 0 ? 2 : 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
      if (n < 0 && errno == EINTR) continue;
      if (cancel_fd >= 0 && fds[1].revents != 0) return absl::CancelledError("shutting down");
      if (n > 0) return absl::OkStatus();
    }
  };
  const int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno != EINPROGRESS) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", hostport));
  }
  if (rc != 0) {
    if (absl::Status s = wait(POLLOUT); !s.ok()) {
      close(fd);
      return s;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("cannot connect to ", hostport));
    }
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host,
                                       "\r\nMetadata: true\r\nMetadata-Flavor: Google\r\n\r\n");
  // A few hundred bytes into an empty socket buffer: one send.
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("cannot send the request");
  }
  std::string reply;
  char buf[4096];
  while (reply.size() < (64 << 10)) {
    if (absl::Status s = wait(POLLIN); !s.ok()) {
      close(fd);
      return s;
    }
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) break;  // the end of the reply (or a broken connection)
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  HttpReply out;
  const size_t sp = reply.find(' ');
  if (!absl::StartsWith(reply, "HTTP/") || sp == std::string::npos ||
      !absl::SimpleAtoi(reply.substr(sp + 1, 3), &out.status)) {
    return absl::UnavailableError("not an HTTP reply");
  }
  const size_t body = reply.find("\r\n\r\n");
  out.body = body == std::string::npos ? "" : reply.substr(body + 4);
  return out;
}

}  // namespace varuna

#include "common/net/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/net/http_request.h"
#include "common/net/rpc.h"
#include "glog/logging.h"

namespace varuna {

// Note [HTTP server]: the daemons' HTTP ports face whoever can reach them, so the server is
// built around what a hostile peer can make it do (issue 23's findings against the library
// it replaces: Range headers turning 3 KB of requests into 1.2 GB of responses, and 20 slow
// connections starving /healthz until a liveness probe restarted a healthy manager).
//   - One poll thread accepts connections, runs TLS handshakes and reads request heads,
//     non-blocking. A head must be complete within `head_deadline` of the accept, whatever
//     the pace of its bytes; a slow peer therefore costs a file descriptor for at most that
//     long and never a handler thread.
//   - Connections are capped per peer address and in total; over the cap a connection gets a
//     canned 503 and is closed at once.
//   - A complete head goes to a bounded queue of handler threads (full: 503), or, for a
//     priority route (/healthz), to a thread of its own, so health is answered while every
//     handler is busy.
//   - GET only, one request per connection (Connection: close), no Range, no compression, no
//     request bodies: every response is exactly what the handler built, once.
//   - A route needs a bearer token unless registered public (when the server has an
//     authorizer); the check runs before the handler, so a 401 costs no daemon work.

struct HttpServer::Connection {
  int fd = -1;
  SSL* ssl = nullptr;
  std::string peer;  // the peer's address, for the per-peer cap
  std::chrono::steady_clock::time_point deadline;
  bool handshaken = false;
  short events = POLLIN;
  std::string in;
  HttpRequestHead head;
  const Route* route = nullptr;
};

namespace {

using Clock = std::chrono::steady_clock;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return status >= 500 ? "Internal Server Error" : "Error";
  }
}

std::string Serialize(const HttpServer::Response& r) {
  std::string out = absl::StrFormat("HTTP/1.1 %d %s\r\n", r.status, Reason(r.status));
  absl::StrAppend(&out, "Content-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
                  "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                  "Connection: close\r\n");
  for (const auto& [k, v] : r.headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
  absl::StrAppend(&out, "\r\n", r.body);
  return out;
}

std::string PeerAddress(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// A mutex-guarded FIFO of connections with a capacity; Close() wakes every waiter.
class ConnQueue {
 public:
  explicit ConnQueue(size_t capacity) : capacity_(capacity) {}
  bool Push(std::unique_ptr<HttpServer::Connection>& c) {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_ || q_.size() >= capacity_) return false;
    q_.push_back(std::move(c));
    cv_.notify_one();
    return true;
  }
  std::unique_ptr<HttpServer::Connection> Pop() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return closed_ || !q_.empty(); });
    if (q_.empty()) return nullptr;
    auto c = std::move(q_.front());
    q_.pop_front();
    return c;
  }
  std::deque<std::unique_ptr<HttpServer::Connection>> Close() {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = true;
    cv_.notify_all();
    return std::move(q_);
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::deque<std::unique_ptr<HttpServer::Connection>> q_;
};

// The server's TLS context (HTTPS): owns the SSL_CTX loaded from the daemon's certificate and
// key, from which each accepted connection's session is made. Without one, plain HTTP.
class ServerTls {
 public:
  ServerTls() = default;
  ~ServerTls() {
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }
  ServerTls(const ServerTls&) = delete;
  ServerTls& operator=(const ServerTls&) = delete;

  // Loads `o`'s certificate chain and key: both, or neither (plain HTTP). Once.
  absl::Status Load(const HttpServer::Options& o);
  bool enabled() const { return ctx_ != nullptr; }
  // A new session for an accepted connection (nullptr if OpenSSL fails). Only when enabled.
  SSL* NewSession() const { return SSL_new(ctx_); }

 private:
  SSL_CTX* ctx_ = nullptr;
};

absl::Status ServerTls::Load(const HttpServer::Options& o) {
  if (o.tls_cert_file.empty() && o.tls_key_file.empty()) return absl::OkStatus();
  if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.who, ": HTTPS needs both a certificate and a key"));
  }
  ctx_ = SSL_CTX_new(TLS_server_method());
  if (ctx_ == nullptr) return absl::InternalError(absl::StrCat(o.who, ": ", OpenSslError()));
  SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx_, o.tls_cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.who, ": HTTPS certificate ", o.tls_cert_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx_, o.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx_) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.who, ": HTTPS key ", o.tls_key_file, ": ", OpenSslError()));
  }
  return absl::OkStatus();
}

// The connection caps (Note [HTTP server]): owns the count of open connections, per peer
// address and in total. Thread-safe: the poll thread admits a connection, whichever thread
// closes it releases it.
class ConnectionLimits {
 public:
  ConnectionLimits(int per_peer, int total) : per_peer_(per_peer), total_(total) {}

  // Counts a new connection from `peer`; false (and nothing counted) when a cap is reached.
  bool Admit(const std::string& peer) {
    std::lock_guard<std::mutex> l(mu_);
    int& n = peers_[peer];
    if (n >= per_peer_ || open_ >= total_) {
      if (n == 0) peers_.erase(peer);
      return false;
    }
    ++n;
    ++open_;
    return true;
  }
  // An admitted connection from `peer` closed.
  void Release(const std::string& peer) {
    std::lock_guard<std::mutex> l(mu_);
    if (--peers_[peer] <= 0) peers_.erase(peer);
    --open_;
  }

 private:
  const int per_peer_;
  const int total_;
  std::mutex mu_;
  std::map<std::string, int> peers_;  // open connections per peer address
  int open_ = 0;
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const Options& o, const std::vector<Route>* routes)
      : o_(o),
        routes_(routes),
        normal_(o.max_queued),
        priority_(16),
        limits_(o.max_connections_per_peer, o.max_connections) {}
  ~Impl() {
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  absl::Status Bind(std::string* address);
  absl::Status LoadTls() { return tls_.Load(o_); }
  void Run();
  void Stop();
  bool tls() const { return tls_.enabled(); }

 private:
  enum class Step { kWait, kDispatched, kClose };
  void IoLoop();
  void Accept();
  Step Advance(std::unique_ptr<Connection>& c);
  void Dispatch(std::unique_ptr<Connection>& c);
  void Serve(ConnQueue* q);
  Response Respond(const Connection& c) const;
  bool HostAllowed(const std::string& host_header) const;
  // Best effort on a non-blocking socket: a canned error for a connection about to close.
  void SendCanned(Connection& c, int status, const std::string& message);
  void WriteAll(Connection& c, const std::string& data);
  void Close(std::unique_ptr<Connection> c);

  const Options o_;
  const std::vector<Route>* routes_;
  ServerTls tls_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::string bound_host_;
  bool loopback_ = true;
  std::atomic<bool> stopping_{false};
  std::thread io_;
  std::vector<std::thread> workers_;
  std::vector<std::unique_ptr<Connection>> reading_;  // io thread only
  ConnQueue normal_;
  ConnQueue priority_;
  ConnectionLimits limits_;
};

absl::Status HttpServer::Impl::Bind(std::string* address) {
  const std::string& listen = o_.listen;
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(o_.who, ": --http_listen '", listen, "' is not HOST:PORT"));
  }
  loopback_ = IsLoopbackListen(listen);
  if (!loopback_ && !o_.allow_remote && !tls_.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o_.who, ": refusing to serve plain HTTP on ", listen,
        ": give the daemon --tls_cert and --tls_key (it then serves HTTPS), bind to 127.0.0.1 "
        "and tunnel, or pass --http_allow_remote"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  bound_host_ = host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(o_.who, ": --http_listen '", listen, "': cannot resolve the host"));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 128) == 0;
  freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat(o_.who, ": cannot listen on ", listen, " (HTTP)"));
  }
  listen_fd_ = fd;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  *address = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat(o_.who, ": eventfd failed"));
  return absl::OkStatus();
}

void HttpServer::Impl::Run() {
  // SSL_write reaches write(2), which raises SIGPIPE on a closed peer; send() uses MSG_NOSIGNAL.
  signal(SIGPIPE, SIG_IGN);
  io_ = std::thread([this] { IoLoop(); });
  for (int i = 0; i < o_.handler_threads; ++i) workers_.emplace_back([this] { Serve(&normal_); });
  workers_.emplace_back([this] { Serve(&priority_); });
}

void HttpServer::Impl::Stop() {
  stopping_ = true;
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
  if (io_.joinable()) io_.join();
  for (auto& c : normal_.Close()) Close(std::move(c));
  for (auto& c : priority_.Close()) Close(std::move(c));
  for (auto& t : workers_) t.join();
  workers_.clear();
  for (auto& c : reading_) Close(std::move(c));
  reading_.clear();
}

void HttpServer::Impl::Close(std::unique_ptr<Connection> c) {
  if (c->ssl != nullptr) {
    if (c->handshaken) SSL_shutdown(c->ssl);
    SSL_free(c->ssl);
  }
  close(c->fd);
  limits_.Release(c->peer);
}

void HttpServer::Impl::IoLoop() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    auto next = Clock::now() + std::chrono::seconds(1);
    for (const auto& c : reading_) {
      fds.push_back({c->fd, c->events, 0});
      next = std::min(next, c->deadline);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    const int ready = poll(fds.data(), fds.size(), std::max<int>(0, wait.count() + 1));
    if (stopping_) break;
    if (ready < 0 && errno != EINTR) {
      PLOG(ERROR) << o_.who << ": HTTP poll";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    // Accept() comes after: reading_ holds exactly the connections polled.
    const size_t polled = fds.size() - 2;
    std::vector<std::unique_ptr<Connection>> keep;
    const auto now = Clock::now();
    for (size_t i = 0; i < polled; ++i) {
      auto& c = reading_[i];
      Step step = Step::kWait;
      if (fds[i + 2].revents != 0) step = Advance(c);
      if (step == Step::kWait && now >= c->deadline) {
        if (c->ssl == nullptr || c->handshaken) {
          SendCanned(*c, 408, "the request head did not arrive in time");
        }
        step = Step::kClose;
      }
      if (step == Step::kWait) keep.push_back(std::move(c));
      if (step == Step::kClose) Close(std::move(c));
    }
    reading_ = std::move(keep);
    if (fds[0].revents != 0) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
    if (fds[1].revents != 0) Accept();
  }
}

void HttpServer::Impl::Accept() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    const int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or out of descriptors: poll again
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->peer = PeerAddress(ss);
    c->deadline = Clock::now() + o_.head_deadline;
    if (!limits_.Admit(c->peer)) {
      if (!tls_.enabled()) {
        const std::string r = Serialize(JsonError(503, "too many connections from this address"));
        (void)!send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      close(fd);
      continue;
    }
    if (tls_.enabled()) {
      c->ssl = tls_.NewSession();
      if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
        Close(std::move(c));
        continue;
      }
    }
    reading_.push_back(std::move(c));
  }
}

HttpServer::Impl::Step HttpServer::Impl::Advance(std::unique_ptr<Connection>& c) {
  if (c->ssl != nullptr && !c->handshaken) {
    const int r = SSL_accept(c->ssl);
    if (r != 1) {
      const int err = SSL_get_error(c->ssl, r);
      if (err == SSL_ERROR_WANT_READ) c->events = POLLIN;
      if (err == SSL_ERROR_WANT_WRITE) c->events = POLLOUT;
      ERR_clear_error();
      return (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) ? Step::kWait
                                                                         : Step::kClose;
    }
    c->handshaken = true;
    c->events = POLLIN;
  }
  char buf[4096];
  for (;;) {
    int n;
    if (c->ssl != nullptr) {
      n = SSL_read(c->ssl, buf, sizeof buf);
      if (n <= 0) {
        const int err = SSL_get_error(c->ssl, n);
        ERR_clear_error();
        if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
          c->events = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
          break;
        }
        return Step::kClose;
      }
    } else {
      n = static_cast<int>(recv(c->fd, buf, sizeof buf, 0));
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      if (n <= 0) return Step::kClose;
    }
    c->in.append(buf, n);
    if (c->in.size() > kMaxRequestHeadBytes + sizeof buf) break;
  }
  const size_t end = RequestHeadEnd(c->in);
  if (end == 0 || end > kMaxRequestHeadBytes) {
    if (c->in.size() <= kMaxRequestHeadBytes) return Step::kWait;
    SendCanned(*c, 431, absl::StrCat("request head over ", kMaxRequestHeadBytes, " bytes"));
    return Step::kClose;
  }
  auto head = ParseRequestHead(absl::string_view(c->in).substr(0, end));
  if (!head.ok()) {
    SendCanned(*c, 400, std::string(head.status().message()));
    return Step::kClose;
  }
  c->head = *std::move(head);
  c->in.clear();
  for (const Route& r : *routes_) {
    if (std::regex_match(c->head.path, r.pattern)) {
      c->route = &r;
      break;
    }
  }
  Dispatch(c);
  return Step::kDispatched;
}

void HttpServer::Impl::Dispatch(std::unique_ptr<Connection>& c) {
  ConnQueue& q = (c->route != nullptr && c->route->priority) ? priority_ : normal_;
  if (q.Push(c)) return;
  SendCanned(*c, 503, "the server is busy; try again");
  Close(std::move(c));
}

void HttpServer::Impl::SendCanned(Connection& c, int status, const std::string& message) {
  const std::string r = Serialize(JsonError(status, message));
  if (c.ssl != nullptr) {
    SSL_write(c.ssl, r.data(), static_cast<int>(r.size()));
    ERR_clear_error();
  } else {
    (void)!send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void HttpServer::Impl::Serve(ConnQueue* q) {
  while (auto c = q->Pop()) {
    WriteAll(*c, Serialize(Respond(*c)));
    Close(std::move(c));
  }
}

void HttpServer::Impl::WriteAll(Connection& c, const std::string& data) {
  // Blocking from here, each write bounded, the whole response bounded by write_deadline.
  fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) & ~O_NONBLOCK);
  const auto deadline = Clock::now() + o_.write_deadline;
  size_t done = 0;
  while (done < data.size() && Clock::now() < deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
    timeval tv{static_cast<time_t>(left / 1000000), static_cast<suseconds_t>(left % 1000000)};
    setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const size_t chunk = std::min<size_t>(data.size() - done, 1 << 16);
    int n;
    if (c.ssl != nullptr) {
      n = SSL_write(c.ssl, data.data() + done, static_cast<int>(chunk));
      if (n <= 0) ERR_clear_error();
    } else {
      n = static_cast<int>(send(c.fd, data.data() + done, chunk, MSG_NOSIGNAL));
    }
    if (n <= 0) return;
    done += n;
  }
}

bool HttpServer::Impl::HostAllowed(const std::string& host_header) const {
  // Note [Host check]: a web page the operator visits could rebind its own name to 127.0.0.1
  // and read the API through the browser (DNS rebinding). When bound to loopback, only
  // requests addressed to an IP literal, localhost or the bound host are served. (Bound
  // beyond loopback, the server is reachable by any name anyway.)
  if (!loopback_) return true;
  std::string host = host_header;
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.find(']') - 1);  // [v6]:port
  } else if (host.find(':') != std::string::npos && host.find(':') == host.rfind(':')) {
    host = host.substr(0, host.find(':'));  // name:port
  }
  if (host.empty() || host == "localhost" || host == bound_host_) return true;
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

HttpServer::Response HttpServer::Impl::Respond(const Connection& c) const {
  const HttpRequestHead& head = c.head;
  if (head.method != "GET") {
    Response r = JsonError(405, absl::StrCat("method ", head.method, " not allowed (GET only)"));
    r.headers.emplace_back("Allow", "GET");
    return r;
  }
  if (!HostAllowed(head.Header("host"))) {
    return JsonError(403, "Host header not allowed (use an IP address or localhost)");
  }
  if (c.route == nullptr) return {404, "text/plain", "not found\n", {}};
  std::optional<std::string> principal;
  if (c.route->access == Access::kToken && o_.authorize) {
    const std::string token = BearerToken(head.Header("authorization"));
    if (!token.empty()) principal = o_.authorize(token);
    if (!principal) {
      Response r = JsonError(401, token.empty() ? "this server needs a bearer token"
                                                : "the token is not in the tokens file");
      r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"varuna\"");
      return r;
    }
  }
  Request req;
  req.path = head.path;
  req.params = head.params;
  req.principal = principal.value_or("");
  std::smatch m;
  if (std::regex_match(req.path, m, c.route->pattern)) {
    for (size_t i = 1; i < m.size(); ++i) req.matches.push_back(m[i].str());
  }
  try {
    return c.route->handler(req);
  } catch (const std::exception& e) {
    LOG(ERROR) << o_.who << ": HTTP handler for " << req.path << " threw: " << e.what();
    return JsonError(500, "internal error");
  }
}

HttpServer::HttpServer() = default;
HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& pattern, Handler handler, Access access, bool priority) {
  routes_.push_back({std::regex(pattern), std::move(handler), access, priority});
}

bool HttpServer::tls() const { return impl_ != nullptr && impl_->tls(); }

absl::Status HttpServer::Start(const Options& options) {
  auto impl = std::make_unique<Impl>(options, &routes_);
  if (absl::Status s = impl->LoadTls(); !s.ok()) return s;
  if (absl::Status s = impl->Bind(&address_); !s.ok()) return s;
  impl_ = std::move(impl);
  impl_->Run();
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (impl_ != nullptr) impl_->Stop();
  impl_.reset();
}

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else if (c >= 0x80) {
      out += '?';
    } else {
      out += ch;
    }
  }
  out += '"';
  return out;
}

HttpServer::Response JsonError(int status, const std::string& message) {
  return {status, "application/json", absl::StrCat("{\"error\": ", JsonString(message), "}"), {}};
}

}  // namespace varuna

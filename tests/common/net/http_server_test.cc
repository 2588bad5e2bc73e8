// The HTTP server as a hostile peer meets it (Note [HTTP server] in common/net/http_server.cc):
// raw sockets, slow heads, many connections, Range headers, missing tokens; and HTTPS.

#include "common/net/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/net/http_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

int Port(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

// A connected TCP socket to 127.0.0.1:port from `source` (another loopback address: another peer).
int Connect(int port, const char* source = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (source != nullptr) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, source, &src.sin_addr);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src), 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the server sends until it closes (or 10 s pass).
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

std::string Exchange(int port, const std::string& request, const char* source = nullptr) {
  const int fd = Connect(port, source);
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string r = ReadAll(fd);
  close(fd);
  return r;
}

std::string Get(int port, const std::string& path, const std::string& extra = "") {
  return Exchange(port,
                  absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n", extra, "\r\n"));
}

int Status(const std::string& response) {
  return response.size() > 12 ? std::atoi(response.c_str() + 9) : 0;
}

std::string Body(const std::string& response) {
  const size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServer::Options o = {}) {
    o.who = "test";
    if (o.listen.empty()) o.listen = "127.0.0.1:0";
    http_.Get("/big", [](const HttpServer::Request&) -> HttpServer::Response {
      return {200, "text/plain", std::string(100000, 'x'), {}};
    });
    http_.Get(R"(/echo/([a-z]+))", [](const HttpServer::Request& r) -> HttpServer::Response {
      auto it = r.params.find("q");
      return {
          200,
          "text/plain",
          absl::StrCat(r.matches[0], "|", it == r.params.end() ? "" : it->second, "|", r.principal),
          {}};
    });
    http_.Get("/slow", [this](const HttpServer::Request&) -> HttpServer::Response {
      release_.wait();
      return {200, "text/plain", "slow\n", {}};
    });
    http_.Get(
        "/open", [](const HttpServer::Request&) -> HttpServer::Response { return {}; },
        HttpServer::Access::kPublic);
    http_.Get(
        "/healthz",
        [](const HttpServer::Request&) -> HttpServer::Response {
          return {200, "text/plain", "ok\n", {}};
        },
        HttpServer::Access::kPublic, /*priority=*/true);
    ASSERT_TRUE(http_.Start(o).ok());
    port_ = Port(http_.address());
  }
  void TearDown() override {
    release_promise_.set_value();
    http_.Stop();
  }

  HttpServer http_;
  int port_ = 0;
  std::promise<void> release_promise_;
  std::shared_future<void> release_ = release_promise_.get_future().share();
};

TEST(HttpRequestTest, ParsesAndRefusesHeads) {
  const std::string head =
      "GET /api/v1/jobs%2Fx?after_step=5&name=a+b%21 HTTP/1.1\r\nHost: h\r\n"
      "Authorization: Bearer  tok \r\n\r\n";
  EXPECT_EQ(RequestHeadEnd(head), head.size());
  EXPECT_EQ(RequestHeadEnd("GET / HTTP/1.1\r\nHost: h\r\n"), 0u);
  auto r = ParseRequestHead(head);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, "GET");
  EXPECT_EQ(r->path, "/api/v1/jobs/x");
  EXPECT_EQ(r->params.at("after_step"), "5");
  EXPECT_EQ(r->params.at("name"), "a b!");
  EXPECT_EQ(BearerToken(r->Header("authorization")), "tok");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("bearer abc"), "abc");
  for (const char* bad :
       {"GET /\r\n\r\n", "GET http://x/ HTTP/1.1\r\n\r\n", "GET /a%00b HTTP/1.1\r\n\r\n",
        "GET / HTTP/2\r\n\r\n", "GET / HTTP/1.1\r\nno colon\r\n\r\n", "G(T / HTTP/1.1\r\n\r\n"}) {
    EXPECT_FALSE(ParseRequestHead(bad).ok()) << bad;
  }
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&many, "X-", i, ": y\r\n");
  EXPECT_THAT(std::string(ParseRequestHead(many + "\r\n").status().message()),
              HasSubstr("headers"));
  EXPECT_FALSE(ParseRequestHead(std::string(9000, 'a')).ok());
}

TEST_F(HttpServerTest, ServesRoutesWithDecodedPathsAndParams) {
  Start();
  const std::string r = Get(port_, "/echo/abc?q=x%20y");
  EXPECT_EQ(Status(r), 200) << r;
  EXPECT_EQ(Body(r), "abc|x y|");
  EXPECT_THAT(r, HasSubstr("Connection: close"));
  EXPECT_EQ(Status(Get(port_, "/nope")), 404);
  EXPECT_EQ(Status(Exchange(port_, "POST /open HTTP/1.1\r\nHost: a\r\n\r\n")), 405);
  EXPECT_EQ(Status(Exchange(port_, "garbage\r\n\r\n")), 400);
  // A rebound DNS name is refused on a loopback server (Note [Host check]).
  EXPECT_EQ(Status(Exchange(port_, "GET /open HTTP/1.1\r\nHost: evil.example\r\n\r\n")), 403);
}

TEST_F(HttpServerTest, RangeHeadersAreIgnoredNotMultiplied) {
  Start();
  std::string ranges = "bytes=0-99999";
  for (int i = 0; i < 200; ++i) ranges += ",0-99999";
  const std::string r = Get(port_, "/big", "Range: " + ranges + "\r\n");
  EXPECT_EQ(Status(r), 200);
  EXPECT_EQ(Body(r).size(), 100000u);  // once, not 201 times
}

TEST_F(HttpServerTest, OversizedHeadIs431) {
  Start();
  const std::string r = Get(port_, "/open", "X-Pad: " + std::string(10000, 'p') + "\r\n");
  EXPECT_EQ(Status(r), 431) << r.substr(0, 200);
}

TEST_F(HttpServerTest, ASlowHeadIsCutAtItsDeadlineWhateverItsPace) {
  HttpServer::Options o;
  o.head_deadline = std::chrono::milliseconds(400);
  Start(o);
  const int fd = Connect(port_);
  const auto t0 = Clock::now();
  // One byte every 50 ms: each read is prompt, the head never ends.
  std::string sent;
  bool closed = false;
  for (int i = 0; i < 60 && !closed; ++i) {
    closed = send(fd, "a", 1, MSG_NOSIGNAL) != 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    char c;
    const ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
    if (n >= 0) closed = true;  // a response (408) or EOF
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_LT(s, 2.0);
}

TEST_F(HttpServerTest, ConnectionsPerPeerAreCapped) {
  HttpServer::Options o;
  o.max_connections_per_peer = 4;
  Start(o);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(Connect(port_));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted
  const int fifth = Connect(port_);
  const std::string r = ReadAll(fifth);
  close(fifth);
  EXPECT_EQ(Status(r), 503) << r;
  EXPECT_THAT(r, HasSubstr("too many connections"));
  // Another peer (127.0.0.2 is loopback too) is not affected.
  EXPECT_EQ(Status(Exchange(port_, "GET /healthz HTTP/1.1\r\n\r\n", "127.0.0.2")), 200);
  for (int fd : held) close(fd);
  // Closed connections give their places back.
  EXPECT_EQ(Status(Get(port_, "/healthz")), 200);
}

TEST_F(HttpServerTest, HealthIsAnsweredWhileSlowPeersAndBusyHandlersHoldEverything) {
  HttpServer::Options o;
  o.handler_threads = 2;
  o.max_queued = 2;
  Start(o);
  std::vector<int> slow;
  for (int i = 0; i < 20; ++i) {  // 20 slow heads, as in the report
    slow.push_back(Connect(port_));
    send(slow.back(), "GET /open HTT", 13, MSG_NOSIGNAL);
  }
  std::vector<std::thread> busy;  // every handler thread blocked, the queue full
  for (int i = 0; i < 4; ++i) busy.emplace_back([this] { Get(port_, "/slow"); });
  // Full (both handlers blocked, the queue holding the rest): more work is refused at once,
  // not queued forever. (Retried: a busy thread may not have sent its request yet.)
  bool refused = false;
  for (int i = 0; i < 5 && !refused; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int fd = Connect(port_);
    timeval tv{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string req = "GET /open HTTP/1.1\r\n\r\n";
    send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    refused = Status(ReadAll(fd)) == 503;
    close(fd);
  }
  EXPECT_TRUE(refused);
  const auto t0 = Clock::now();
  const std::string r = Get(port_, "/healthz");
  EXPECT_EQ(Status(r), 200) << r;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  release_promise_.set_value();
  release_promise_ = std::promise<void>();
  for (auto& t : busy) t.join();
  for (int fd : slow) close(fd);
}

TEST_F(HttpServerTest, TokenRoutesNeedTheBearerToken) {
  HttpServer::Options o;
  o.authorize = [](const std::string& t) -> std::optional<std::string> {
    if (t == "good-token-0123456789") return "good";
    return std::nullopt;
  };
  Start(o);
  const std::string none = Get(port_, "/echo/a");
  EXPECT_EQ(Status(none), 401);
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_EQ(Status(Get(port_, "/echo/a", "Authorization: Bearer wrong\r\n")), 401);
  const std::string good = Get(port_, "/echo/a", "Authorization: Bearer good-token-0123456789\r\n");
  EXPECT_EQ(Status(good), 200);
  EXPECT_THAT(good, HasSubstr("a||good"));  // the handler knows who the token is
  EXPECT_EQ(Status(Get(port_, "/open")), 200);
  EXPECT_EQ(Status(Get(port_, "/healthz")), 200);
}

TEST(HttpServerStartTest, PlainHttpBeyondLoopbackNeedsTlsOrTheFlag) {
  HttpServer http;
  HttpServer::Options o;
  o.who = "test";
  o.listen = "0.0.0.0:0";
  const absl::Status s = http.Start(o);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("--http_allow_remote"));
  o.tls_cert_file = "/nonexistent.pem";
  o.tls_key_file = "/nonexistent.key";
  EXPECT_THAT(std::string(http.Start(o).message()), HasSubstr("/nonexistent.pem"));
}

TEST(HttpServerTlsTest, ServesHttpsWithTheDaemonsCertificate) {
  const std::string dir = ::testing::TempDir() + "/http_tls_certs";
  std::filesystem::remove_all(dir);
  ASSERT_EQ(std::system(absl::StrCat(VARUNA_SOURCE_DIR, "/scripts/make_certs.sh ", dir,
                                     " varuna-manager=127.0.0.1 > /dev/null")
                            .c_str()),
            0);
  HttpServer http;
  http.Get(
      "/healthz",
      [](const HttpServer::Request&) -> HttpServer::Response {
        return {200, "text/plain", "ok\n", {}};
      },
      HttpServer::Access::kPublic);
  HttpServer::Options o;
  o.who = "test";
  o.listen = "127.0.0.1:0";
  o.tls_cert_file = dir + "/varuna-manager.pem";
  o.tls_key_file = dir + "/varuna-manager.key";
  ASSERT_TRUE(http.Start(o).ok());
  EXPECT_TRUE(http.tls());
  const int port = Port(http.address());
  // Plain HTTP to an HTTPS port gets nothing useful.
  EXPECT_NE(Status(Get(port, "/healthz")), 200);
  // A TLS client that checks the chain against the cluster CA.
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx, (dir + "/ca.pem").c_str(), nullptr), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int fd = Connect(port);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  ASSERT_EQ(SSL_connect(ssl), 1);
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(SSL_write(ssl, req.data(), req.size()), static_cast<int>(req.size()));
  std::string resp;
  char buf[4096];
  for (int n; (n = SSL_read(ssl, buf, sizeof buf)) > 0;) resp.append(buf, n);
  EXPECT_EQ(Status(resp), 200) << resp;
  EXPECT_EQ(Body(resp), "ok\n");
  SSL_free(ssl);
  close(fd);
  SSL_CTX_free(ctx);
}

}  // namespace
}  // namespace varuna

#pragma once

// The HTTP(S) server behind /metrics, /healthz, the dashboard and its JSON API
// (docs/observability.md, docs/operations.md "Security"). GET only, one request per
// connection, built to be reachable by anyone (Note [HTTP server] in http_server.cc): request
// heads are read on one poll thread with a total deadline, so a slow peer holds no handler
// thread; connections per peer are capped; /healthz has a thread of its own; routes need a
// bearer token unless registered public. Handlers run on the server's threads: they must not
// touch a daemon's state directly (the manager's go through its event loop).

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace varuna {

class HttpServer {
 public:
  struct Request {
    std::string path;
    std::map<std::string, std::string> params;  // query parameters
    std::vector<std::string> matches;           // the pattern's capture groups
    std::string principal;  // who the authorizer said the bearer token is ("" without one)
  };
  struct Response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  // extra ones
  };
  using Handler = std::function<Response(const Request&)>;
  // Who may call a route: anyone, or (when the server has an authorizer) a bearer token.
  enum class Access { kToken, kPublic };

  struct Options {
    std::string who;     // for messages: "varuna-manager"
    std::string listen;  // HOST:PORT; port 0 picks a free one
    // Plain HTTP beyond loopback needs this (the daemons' --http_allow_remote); HTTPS does not.
    bool allow_remote = false;
    // HTTPS with these (PEM paths: the daemon's own certificate and key); plain HTTP if empty.
    std::string tls_cert_file;
    std::string tls_key_file;
    // Who a bearer token is (Request::principal), or nullopt when it may not call kToken
    // routes; unset: every route is public.
    std::function<std::optional<std::string>(const std::string& token)> authorize;
    int max_connections_per_peer = 32;
    int max_connections = 512;
    std::chrono::milliseconds head_deadline{5000};    // accept (and TLS handshake) to full head
    std::chrono::milliseconds write_deadline{10000};  // the whole response
    int handler_threads = 8;
    int max_queued = 64;  // requests waiting for a handler thread; more get 503
  };

  HttpServer();
  ~HttpServer();  // Stops.
  // Routes GET requests whose path fully matches `pattern` (ECMAScript regex). Before Start.
  // `priority`: served on a thread of its own, never queued behind other routes (health).
  void Get(const std::string& pattern, Handler handler, Access access = Access::kToken,
           bool priority = false);
  absl::Status Start(const Options& options);
  // HOST:PORT actually bound ("" before Start).
  const std::string& address() const { return address_; }
  bool tls() const;
  void Stop();

  struct Connection;  // http_server.cc
  struct Route {
    std::regex pattern;
    Handler handler;
    Access access;
    bool priority;
  };

 private:
  class Impl;
  std::vector<Route> routes_;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

HttpServer::Response JsonError(int status, const std::string& message);
// `text` as a JSON string literal (quotes included); bytes outside printable ASCII become
// \u escapes or '?', so any log line makes valid JSON.
std::string JsonString(std::string_view text);

}  // namespace varuna

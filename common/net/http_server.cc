#include "common/net/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/net/rpc.h"

namespace varuna {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {
  // An idle keep-alive connection holds a worker thread: keep them short, and the pool big
  // enough for a few dashboard tabs plus scrapes and probes.
  server_->set_keep_alive_max_count(5);
  server_->set_keep_alive_timeout(1);
  server_->set_read_timeout(10, 0);
  server_->set_write_timeout(10, 0);
  server_->new_task_queue = [] { return new httplib::ThreadPool(16); };
  // Note [Host check]: a web page the operator visits could rebind its own name to 127.0.0.1
  // and read the API through the browser (DNS rebinding). Only requests addressed to an IP
  // literal, localhost or the bound host are served, when bound to loopback.
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::string host = req.get_header_value("Host");
    if (!host.empty() && host.front() == '[') {
      host = host.substr(1, host.find(']') - 1);  // [v6]:port
    } else if (host.find(':') != std::string::npos && host.find(':') == host.rfind(':')) {
      host = host.substr(0, host.find(':'));  // name:port
    }
    if (HostAllowed(host)) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 403;
    res.set_content("{\"error\": \"Host header not allowed (use an IP address or localhost)\"}",
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Get(const std::string& pattern, Handler handler) {
  server_->Get(pattern, [handler](const httplib::Request& req, httplib::Response& res) {
    Request r;
    r.path = req.path;
    for (const auto& [k, v] : req.params) r.params[k] = v;
    for (size_t i = 1; i < req.matches.size(); ++i) r.matches.push_back(req.matches[i]);
    Response out = handler(r);
    res.status = out.status;
    res.set_header("Cache-Control", "no-store");
    res.set_content(out.body, out.content_type.c_str());
  });
}

bool HttpServer::HostAllowed(const std::string& host) const {
  // Bound beyond loopback (--http_allow_remote), the server is reachable by any name anyway.
  if (!loopback_) return true;
  if (host.empty() || host == "localhost" || host == bound_host_) return true;
  struct in6_addr a6;
  struct in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

absl::Status HttpServer::Start(const std::string& who, const std::string& listen,
                               bool allow_remote) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": --http_listen '", listen, "' is not HOST:PORT"));
  }
  if (!IsLoopbackListen(listen) && !allow_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": refusing to serve plain HTTP on ", listen,
        " (the dashboard and /metrics have no TLS): bind to 127.0.0.1 and tunnel, or pass "
        "--http_allow_remote"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (port == 0) {
    port = server_->bind_to_any_port(host);
  } else if (!server_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat(who, ": cannot listen on ", listen, " (HTTP)"));
  }
  address_ = absl::StrCat(host, ":", port);
  bound_host_ = host;
  loopback_ = IsLoopbackListen(listen);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() is a no-op until the accept loop runs: wait for it, so Stop() cannot hang.
  for (int i = 0; i < 500 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!server_->is_running()) {
    return absl::InternalError(
        absl::StrCat(who, ": the HTTP server on ", listen, " did not start"));
  }
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
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
  return {status, "application/json", absl::StrCat("{\"error\": ", JsonString(message), "}")};
}

}  // namespace varuna

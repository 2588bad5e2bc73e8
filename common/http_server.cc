#include "common/http_server.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace varuna {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {
  // Keep-alive connections would each hold a worker thread; the dashboard polls anyway.
  server_->set_keep_alive_max_count(20);
  server_->set_read_timeout(10, 0);
  server_->set_write_timeout(10, 0);
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

absl::Status HttpServer::Start(const std::string& who, const std::string& listen,
                               bool allow_insecure) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": --http_listen '", listen, "' is not HOST:PORT"));
  }
  if (!IsLoopbackListen(listen) && !allow_insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": refusing to serve plain HTTP on ", listen,
        " (the dashboard and /metrics have no TLS): bind to 127.0.0.1 and tunnel, or pass "
        "--allow_insecure"));
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
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

std::string ProtoJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
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

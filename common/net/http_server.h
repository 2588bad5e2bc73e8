#pragma once

// A small HTTP/1.1 server for /metrics, /healthz, the dashboard and its JSON API
// (docs/observability.md), on cpp-httplib. Handlers run on the server's own threads: they must
// not touch a daemon's state directly (the manager's handlers go through its event loop).

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/net/proto_json.h"

namespace google::protobuf {
class Message;
}
namespace httplib {
class Server;
}

namespace varuna {

class HttpServer {
 public:
  struct Request {
    std::string path;
    std::map<std::string, std::string> params;  // query parameters
    std::vector<std::string> matches;           // the pattern's capture groups
  };
  struct Response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
  };
  using Handler = std::function<Response(const Request&)>;

  HttpServer();
  ~HttpServer();  // Stops.
  // Routes GET requests whose path fully matches `pattern` (ECMAScript regex).
  void Get(const std::string& pattern, Handler handler);
  // Binds `listen` (HOST:PORT; port 0 picks a free one) and serves on a background thread.
  // Beyond loopback it needs `allow_remote` (the server speaks plain HTTP; the daemons'
  // --http_allow_remote, separate from --allow_insecure, which concerns gRPC).
  absl::Status Start(const std::string& who, const std::string& listen, bool allow_remote);
  // HOST:PORT actually bound ("" before Start).
  const std::string& address() const { return address_; }
  void Stop();

 private:
  bool HostAllowed(const std::string& host) const;  // Note [Host check]
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string address_;
  std::string bound_host_;
  bool loopback_ = true;
};

HttpServer::Response JsonError(int status, const std::string& message);
// `text` as a JSON string literal (quotes included); bytes outside printable ASCII become
// \u escapes or '?', so any log line makes valid JSON.
std::string JsonString(std::string_view text);

}  // namespace varuna

#pragma once

// gRPC glue shared by the daemons and the CLI: the one place absl::Status and grpc::Status
// convert, channel creation, and host:port handling.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varuna {

grpc::Status ToGrpcStatus(const absl::Status& s);
// `what` names the call for the message, e.g. "manager 127.0.0.1:7000 Submit".
absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what = "");

// An insecure channel to `address` (host:port) with keepalive and reconnect backoff suited
// to a LAN control plane.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets a deadline of `timeout` from now on a fresh context.
void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout);

// Splits "host:port" (IPv6 as "[::1]:port"). InvalidArgument naming the text otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

// Starts a server on `listen` (port 0 picks one) with `services`; returns the server and
// the address it is reachable at ("host:actual_port"). `advertise_host` replaces a wildcard
// listen host (0.0.0.0, [::]) in the returned address; empty = this machine's hostname.
struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};
absl::StatusOr<StartedServer> StartServer(const std::string& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const std::string& advertise_host = "");

}  // namespace varuna

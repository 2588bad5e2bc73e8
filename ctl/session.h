#pragma once

// What every varunactl command runs with: the output streams, the output format, and the
// manager (address, credentials, stub) when the command talks to one.

#include <grpcpp/grpcpp.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/net/rpc.h"
#include "varuna/v1/control.grpc.pb.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace varuna::ctl {

// Where a session's manager comes from: the global flags, else the environment.
struct ManagerOptions {
  std::string address;  // HOST:PORT; empty = none
  std::string tls_ca;   // the cluster CA's PEM file; empty = plaintext
  std::string token;    // bearer token; empty = none sent
};

// `text` with every control character (ESC and the rest of C0, DEL) shown as '?': what a peer
// or another user wrote never drives this terminal.
std::string Printable(const std::string& text);

class Session {
 public:
  // `json`: -o json (machine-readable output) instead of tables.
  Session(std::ostream& out, std::ostream& err, bool json) : out_(out), err_(err), json_(json) {}

  // Checks the address and loads the CA, then makes the stub (gRPC connects on the first
  // call). InvalidArgument naming a bad address or CA file.
  absl::Status Connect(const ManagerOptions& options);

  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }
  bool json() const { return json_; }
  // The manager's address; empty when none was given.
  const std::string& manager() const { return manager_; }
  // Null until Connect succeeds.
  v1::JobApi::Stub* stub() const { return stub_.get(); }
  // With several managers: asks them again who leads and talks to it from now on (after a
  // call found its manager gone, or a standby). False with one manager.
  bool FindLeader();
  bool several_managers() const { return !managers_.empty(); }

  // A context for one call: deadline `timeout` from now, the token if there is one.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) const;
  // A failed call's status, its message naming the manager and `call`, with a hint about
  // TLS when the manager could not be reached.
  absl::Status CallError(const grpc::Status& s, const std::string& call) const;
  // `m` as protobuf JSON on one line (the -o json format).
  std::string Json(const google::protobuf::Message& m) const;

 private:
  std::ostream& out_;
  std::ostream& err_;
  const bool json_;
  std::string manager_;
  std::vector<std::string> managers_;  // when several were given
  TlsConfig tls_config_;
  std::string token_;
  bool tls_ = false;
  std::unique_ptr<v1::JobApi::Stub> stub_;
};

}  // namespace varuna::ctl

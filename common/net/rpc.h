#pragma once

// gRPC glue shared by the daemons and the CLI: the one place absl::Status and grpc::Status
// convert, channel creation, and host:port handling.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace varuna {

// TLS material (PEM files). All empty = plaintext. docs/operations.md "Security".
struct TlsFiles {
  std::string ca;    // the cluster CA: peers' certificates must chain to it
  std::string cert;  // this process's certificate
  std::string key;   // and its private key
  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};
// The files' contents, read once at start-up.
struct TlsConfig {
  bool enabled = false;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};
// Reads the files; `need_cert`: cert and key are required (daemons), else only the CA
// (varunactl). Errors name `who` and the missing or unreadable file.
absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files, bool need_cert, const std::string& who);

// OK if `listen` is a loopback address, or `allow_insecure`; otherwise TLS is required.
absl::Status CheckListenSecurity(const std::string& who, const std::string& listen, bool tls,
                                 bool allow_insecure);
bool IsLoopbackListen(const std::string& listen);

// The common name of the peer's verified client certificate; empty if it presented none
// (or the connection is plaintext).
std::string PeerCommonName(const grpc::ServerContextBase& ctx);

grpc::Status ToGrpcStatus(const absl::Status& s);
// `what` names the call for the message, e.g. "manager 127.0.0.1:7000 Submit".
absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what = "");

// A channel to `address` (host:port) with keepalive and reconnect backoff suited to a LAN
// control plane: TLS when `tls.enabled` (the server's certificate is verified against the CA
// and must name the host; a client certificate is presented when one is loaded), else
// plaintext.
// `peer_name`: with TLS, the name the server's certificate must carry (default: the
// address's host).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsConfig& tls = {},
                                           const std::string& peer_name = "");

// "a:7070, b:7070" -> {"a:7070", "b:7070"} (a list of managers; empty parts dropped).
std::vector<std::string> SplitAddressList(const std::string& list);
// The leader a standby manager named in its answer (trailing metadata `varuna-leader`;
// Note [Following the leader] in agent/agent_server.cc), or "".
std::string LeaderFromTrailers(const grpc::ClientContext& ctx);

// Sets a deadline of `timeout` from now on a fresh context.
void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout);

// Splits "host:port" (IPv6 as "[::1]:port"). InvalidArgument naming the text otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

// An address one daemon gives others to dial (a manager's --advertise, the leader it names in
// gRPC metadata): HOST:PORT of at most 261 characters, the host a name, an IPv4 address or a
// bracketed IPv6 one (letters, digits, '.', '-', '_', ':' inside brackets), the port 1-65535.
// InvalidArgument otherwise, with the text C-escaped.
absl::Status CheckPeerAddress(const std::string& address);

// Starts a server on `listen` (port 0 picks one) with `services`; returns the server and
// the address it is reachable at ("host:actual_port"). `advertise_host` replaces a wildcard
// listen host (0.0.0.0, [::]) in the returned address; empty = this machine's hostname.
// With TLS, `client_certs` says what the server asks of clients: kOptional verifies a
// certificate when one is presented (the handlers decide who needs one), kRequired refuses
// the handshake without one. Requests are capped at kMaxRpcBytes.
struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;
};
enum class ClientCerts { kOptional, kRequired };
inline constexpr int kMaxRpcBytes = 4 << 20;
absl::StatusOr<StartedServer> StartServer(const std::string& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const std::string& advertise_host = "",
                                          const TlsConfig& tls = {},
                                          ClientCerts client_certs = ClientCerts::kOptional);

}  // namespace varuna

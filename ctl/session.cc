#include "ctl/session.h"

#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/net/proto_json.h"
#include "common/net/rpc.h"

namespace varuna::ctl {

std::string Printable(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return out;
}

absl::Status Session::Connect(const ManagerOptions& options) {
  const std::vector<std::string> managers = SplitAddressList(options.address);
  if (managers.empty()) RETURN_IF_ERROR(SplitHostPort(options.address).status());
  for (const std::string& m : managers) RETURN_IF_ERROR(SplitHostPort(m).status());
  // A header carries printable ASCII only; gRPC aborts the process on anything else.
  for (char c : options.token) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7e) {
      return absl::InvalidArgumentError(
          "the token (--token or $VARUNA_TOKEN) holds a character a header cannot carry (a "
          "space, a newline or a control character): check how it was copied");
    }
  }
  TlsFiles files;
  files.ca = options.tls_ca;
  ASSIGN_OR_RETURN(TlsConfig tls, LoadTls(files, /*need_cert=*/false, "varunactl"));
  token_ = options.token;
  tls_ = tls.enabled;
  manager_ = managers.empty() ? options.address : managers[0];
  tls_config_ = tls;
  if (managers.size() > 1) managers_ = managers;
  if (!FindLeader()) stub_ = v1::JobApi::NewStub(MakeChannel(manager_, tls));
  return absl::OkStatus();
}

// Several managers (Note [Following the leader] in agent/agent_server.cc): the first that
// answers says who leads, and the command talks to the leader.
bool Session::FindLeader() {
  if (managers_.empty()) return false;
  for (const std::string& m : managers_) {
    auto stub = v1::JobApi::NewStub(MakeChannel(m, tls_config_));
    v1::ListManagersResponse who;
    if (!stub->ListManagers(Context(absl::Seconds(2)).get(), v1::ListManagersRequest(), &who)
             .ok()) {
      continue;
    }
    manager_ = who.leader().empty() ? m : who.leader();
    break;
  }
  stub_ = v1::JobApi::NewStub(MakeChannel(manager_, tls_config_));
  return true;
}

std::unique_ptr<grpc::ClientContext> Session::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  SetDeadline(ctx.get(), timeout);
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  return ctx;
}

absl::Status Session::CallError(const grpc::Status& s, const std::string& call) const {
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(
        absl::StrCat("manager ", manager_, " refused ", call, ": ", s.error_message()));
  }
  absl::Status st = FromGrpcStatus(s, absl::StrCat("manager ", manager_, " (", call, ")"));
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // A TLS manager and a plaintext client (or the reverse) look like an unreachable peer.
    return absl::UnavailableError(absl::StrCat(
        st.message(),
        tls_ ? " (TLS handshake: is the manager using TLS with a certificate from this CA?)"
             : " (if the manager uses TLS, pass --tls_ca or set VARUNA_TLS_CA)"));
  }
  return st;
}

std::string Session::Json(const google::protobuf::Message& m) const { return ProtoJson(m); }

}  // namespace varuna::ctl

#include "common/net/rpc.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"

namespace varuna {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    msg = absl::StrCat("cannot reach ", what.empty() ? "peer" : what, ": ", msg);
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    msg = absl::StrCat(what.empty() ? "call" : what, " timed out: ", msg);
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files, bool need_cert, const std::string& who) {
  TlsConfig tls;
  if (!files.enabled()) return tls;
  auto read = [&](const std::string& path, const char* flag, std::string* out) -> absl::Status {
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": TLS needs ", flag, " (set --tls_ca, --tls_cert and --tls_key)"));
    }
    auto pem = ReadRegularFile(path, 1 << 20, absl::StrCat(who, " ", flag));
    if (!pem.ok()) return pem.status();
    if (pem->find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(who, " ", flag, " ", path, " is not PEM"));
    }
    *out = *std::move(pem);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(read(files.ca, "--tls_ca", &tls.ca_pem));
  if (need_cert || !files.cert.empty() || !files.key.empty()) {
    RETURN_IF_ERROR(read(files.cert, "--tls_cert", &tls.cert_pem));
    RETURN_IF_ERROR(read(files.key, "--tls_key", &tls.key_pem));
  }
  tls.enabled = true;
  return tls;
}

bool IsLoopbackListen(const std::string& listen) {
  auto hp = SplitHostPort(listen);
  if (!hp.ok()) return false;
  const std::string& host = hp->first;
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

absl::Status CheckListenSecurity(const std::string& who, const std::string& listen, bool tls,
                                 bool allow_insecure) {
  RETURN_IF_ERROR(SplitHostPort(listen).status());
  if (tls || allow_insecure || IsLoopbackListen(listen)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, ": refusing to listen on ", listen,
      " without TLS: anyone who reaches it could use it. Give --tls_ca, --tls_cert and "
      "--tls_key (scripts/make_certs.sh makes them), or --allow_insecure on a trusted network"));
}

std::string PeerCommonName(const grpc::ServerContextBase& ctx) {
  auto auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  for (const auto& v : auth->FindPropertyValues("x509_common_name")) {
    return std::string(v.data(), v.size());
  }
  return "";
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsConfig& tls,
                                           const std::string& peer_name) {
  grpc::ChannelArguments args;
  if (tls.enabled && !peer_name.empty()) args.SetSslTargetNameOverride(peer_name);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  // Reconnect quickly after a daemon restart: the default backoff grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(kMaxRpcBytes * 4);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (tls.enabled) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = tls.ca_pem;
    o.pem_private_key = tls.key_pem;
    o.pem_cert_chain = tls.cert_pem;
    creds = grpc::SslCredentials(o);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

std::vector<std::string> SplitAddressList(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

std::string LeaderFromTrailers(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find("varuna-leader");
  if (it == md.end()) return "";
  return std::string(it->second.data(), std::min<size_t>(it->second.size(), 255));
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not HOST:PORT (e.g. 127.0.0.1:7070)"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

absl::Status CheckPeerAddress(const std::string& address) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address '", absl::CHexEscape(address.substr(0, 300)), "' ", why,
        " (want HOST:PORT: a host name, an IPv4 address or [IPv6], and a port 1-65535)"));
  };
  if (address.size() > 261) return bad("is too long");
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return bad("has no port");
  }
  const std::string host = address.substr(0, colon);
  const bool bracketed = host.size() >= 3 && host.front() == '[' && host.back() == ']';
  const std::string inner = bracketed ? host.substr(1, host.size() - 2) : host;
  for (char c : inner) {
    const bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
                    c == '_' || (bracketed && c == ':');
    if (!ok) return bad("has a character a host name cannot have");
  }
  if (inner.empty() || inner.front() == '-' || inner.front() == '.') return bad("has no host");
  return absl::OkStatus();
}

absl::StatusOr<StartedServer> StartServer(const std::string& listen,
                                          const std::vector<grpc::Service*>& services,
                                          const std::string& advertise_host, const TlsConfig& tls,
                                          ClientCerts client_certs) {
  auto hp = SplitHostPort(listen);
  if (!hp.ok()) return hp.status();
  grpc::ServerBuilder builder;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls.enabled) {
    grpc::SslServerCredentialsOptions o(
        client_certs == ClientCerts::kRequired
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    o.pem_root_certs = tls.ca_pem;
    o.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
    creds = grpc::SslServerCredentials(o);
  }
  builder.AddListeningPort(listen, creds, &port);
  builder.SetMaxReceiveMessageSize(kMaxRpcBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or not local?)"));
  }
  std::string host = hp->first;
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    if (!advertise_host.empty()) {
      host = advertise_host;
    } else {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      host = name;
    }
  }
  const bool v6 = host.find(':') != std::string::npos;
  return StartedServer{std::move(server),
                       v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port)};
}

}  // namespace varuna

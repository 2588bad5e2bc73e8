#include "manager/ha/etcd_client.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"

namespace varuna {

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const std::string& endpoints,
                                                                const TlsConfig& tls,
                                                                absl::Duration timeout) {
  std::vector<Endpoint> eps;
  for (absl::string_view part : absl::StrSplit(endpoints, ',', absl::SkipWhitespace())) {
    std::string address(absl::StripAsciiWhitespace(part));
    // etcd's own spelling (--listen-client-urls) is accepted too.
    for (absl::string_view scheme : {"http://", "https://"}) {
      if (absl::StartsWith(address, scheme)) address = address.substr(scheme.size());
    }
    RETURN_IF_ERROR(SplitHostPort(address).status());
    Endpoint e;
    e.address = address;
    auto channel = MakeChannel(address, tls);
    e.kv = etcdserverpb::KV::NewStub(channel);
    e.lease = etcdserverpb::Lease::NewStub(channel);
    eps.push_back(std::move(e));
  }
  if (eps.empty()) {
    return absl::InvalidArgumentError("--etcd_endpoints: no endpoint (host:port,...)");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(endpoints, std::move(eps), timeout));
}

namespace {

// A write refused before it reached raft: safe to send to another member.
bool NotApplied(const grpc::Status& s) {
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string& m = s.error_message();
  // etcd's own refusals say "etcdserver: ..."; of those only these are known to be made
  // before the proposal (a timeout or a leader change may still commit it).
  // No connection: never sent; or a connection that broke (the member died) after it was
  // sent: then the same write may apply twice, still before the leader's next write, which
  // it sends only after this one returns. Either way, safe to send elsewhere.
  if (!absl::StartsWith(m, "etcdserver:")) return true;
  return absl::StrContains(m, "no leader") || absl::StrContains(m, "not capable") ||
         absl::StrContains(m, "too many requests");
}

}  // namespace

// A read's attempt gets at most half a second; an endpoint that cannot answer (down, or a
// member without a raft leader for the second an etcd election takes) passes the call to the
// next, round after round, until the call's whole time is spent. A write's attempt gets the
// whole time, and moves on only when NotApplied (Note [etcd over gRPC]).
absl::Status EtcdClient::Call(
    const char* what, Kind kind,
    const std::function<grpc::Status(Endpoint&, grpc::ClientContext*)>& call, absl::Time deadline) {
  size_t i;
  {
    absl::MutexLock lock(&mu_);
    i = current_;
  }
  deadline = std::min(deadline, absl::Now() + timeout_);
  const absl::Duration attempt =
      kind == Kind::kRead ? absl::Milliseconds(500) : absl::InfiniteDuration();
  grpc::Status last;
  for (size_t tried = 0;; ++tried, ++i) {
    if (tried > 0 && tried % endpoints_.size() == 0) absl::SleepFor(absl::Milliseconds(50));
    const absl::Time now = absl::Now();
    if (tried > 0 && now >= deadline) break;
    Endpoint& e = endpoints_[i % endpoints_.size()];
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, now + attempt)));
    last = call(e, &ctx);
    const bool next = kind == Kind::kRead
                          ? last.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                          : NotApplied(last);
    if (!next) {
      absl::MutexLock lock(&mu_);
      current_ = i % endpoints_.size();
      break;
    }
  }
  if (last.ok()) return absl::OkStatus();
  return FromGrpcStatus(last, absl::StrCat("etcd ", endpoints_text_, " ", what));
}

absl::StatusOr<std::vector<EtcdKv>> EtcdClient::GetPrefix(const std::string& prefix) {
  std::vector<EtcdKv> out;
  std::string from = prefix;
  const std::string end = PrefixEnd(prefix);
  // Pages of up to 500 keys; a page over gRPC's 4 MiB message limit (large values: step
  // chunks are up to 256 KiB) is asked again with half as many.
  int64_t limit = 500;
  while (true) {
    etcdserverpb::RangeRequest req;
    req.set_key(from);
    req.set_range_end(end);
    req.set_limit(limit);
    etcdserverpb::RangeResponse resp;
    absl::Status s = Call("Range", Kind::kRead, [&](Endpoint& e, grpc::ClientContext* ctx) {
      return e.kv->Range(ctx, req, &resp);
    });
    if (absl::IsResourceExhausted(s) && limit > 1) {
      limit /= 2;
      continue;
    }
    RETURN_IF_ERROR(s);
    for (const auto& kv : resp.kvs()) {
      out.push_back({kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()});
    }
    if (!resp.more() || resp.kvs().empty()) break;
    from = resp.kvs(resp.kvs_size() - 1).key() + std::string(1, '\0');
  }
  return out;
}

absl::StatusOr<std::vector<EtcdKv>> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  etcdserverpb::RangeResponse resp;
  RETURN_IF_ERROR(Call("Range", Kind::kRead, [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.kv->Range(ctx, req, &resp);
  }));
  std::vector<EtcdKv> out;
  for (const auto& kv : resp.kvs()) {
    out.push_back({kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()});
  }
  return out;
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  return Call("Put", Kind::kWrite,
              [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Put(ctx, req, &resp); });
}

absl::Status EtcdClient::DeletePrefix(const std::string& prefix) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  etcdserverpb::DeleteRangeResponse resp;
  return Call("DeleteRange", Kind::kWrite, [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.kv->DeleteRange(ctx, req, &resp);
  });
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(const etcdserverpb::TxnRequest& req) {
  etcdserverpb::TxnResponse resp;
  RETURN_IF_ERROR(Call("Txn", Kind::kWrite, [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.kv->Txn(ctx, req, &resp);
  }));
  return resp;
}

absl::StatusOr<int64_t> EtcdClient::LeaseGrant(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  RETURN_IF_ERROR(Call("LeaseGrant", Kind::kRead, [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.lease->LeaseGrant(ctx, req, &resp);
  }));
  if (!resp.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", resp.error()));
  }
  return resp.id();
}

absl::Status EtcdClient::LeaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  return Call("LeaseRevoke", Kind::kRead, [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.lease->LeaseRevoke(ctx, req, &resp);
  });
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t id, absl::Time deadline) {
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse resp;
  bool got = false;
  RETURN_IF_ERROR(Call(
      "LeaseKeepAlive", Kind::kRead,
      [&](Endpoint& e, grpc::ClientContext* ctx) {
        auto stream = e.lease->LeaseKeepAlive(ctx);
        if (!stream->Write(req)) return stream->Finish();
        stream->WritesDone();
        got = stream->Read(&resp);
        return stream->Finish();
      },
      deadline));
  if (!got) return absl::UnavailableError("etcd LeaseKeepAlive: no answer");
  return resp.ttl();
}

}  // namespace varuna

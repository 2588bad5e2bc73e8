#pragma once

// A small synchronous client of etcd's v3 API: get, put, delete, transactions and leases, on
// one or more endpoints. What the HA manager needs (manager/ha/leader_election.h,
// manager/ha/etcd_store.h), no more.
//
// Note [etcd over gRPC]: the manager speaks etcd's own gRPC API from protos this project
// defines (proto/etcd/: etcd's package, message and field numbers, only the calls used), not
// the JSON gateway: gRPC is already how every Varuna daemon talks, it carries the cluster's
// mutual TLS the same way, keepalives are a stream rather than one HTTP request each, and
// bytes keys and values need no base64. Debian packages no C++ etcd client. A read or a
// keepalive that an endpoint does not answer in half a second goes to the next endpoint; a
// write (a transaction, put or delete) goes to another only when the first cannot have
// applied it (no connection, or a member without a raft leader): a write that timed out may
// still land, and sent again elsewhere it could land after a newer write and undo it. Such
// a write fails instead, and a leader whose write fails stops (manager/ha/etcd_store.h).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/net/rpc.h"
#include "etcd/rpc.grpc.pb.h"

namespace varuna {

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

// The smallest key after every key with `prefix` (etcd's range_end for a prefix).
std::string PrefixEnd(const std::string& prefix);

class EtcdClient {
 public:
  // `endpoints`: "host:port[,host:port...]". Calls go to one endpoint; when it cannot be
  // reached the next one is tried (a member forwards writes to etcd's leader itself).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const std::string& endpoints,
                                                             const TlsConfig& tls,
                                                             absl::Duration timeout);

  // Every key with `prefix` (paged underneath), in key order.
  absl::StatusOr<std::vector<EtcdKv>> GetPrefix(const std::string& prefix);
  absl::StatusOr<std::vector<EtcdKv>> Get(const std::string& key);  // empty if absent
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  absl::Status DeletePrefix(const std::string& prefix);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& req);
  absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s);
  absl::Status LeaseRevoke(int64_t id);
  // One keepalive; the lease's remaining TTL in seconds (<= 0: the lease has expired). Gives
  // up at `deadline` if that comes before the client's timeout.
  absl::StatusOr<int64_t> KeepAlive(int64_t id, absl::Time deadline = absl::InfiniteFuture());

  const std::string& endpoints() const { return endpoints_text_; }

 private:
  struct Endpoint {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  };
  EtcdClient(std::string text, std::vector<Endpoint> endpoints, absl::Duration timeout)
      : endpoints_text_(std::move(text)), endpoints_(std::move(endpoints)), timeout_(timeout) {}
  // Runs `call` on the current endpoint, moving on to the next while one is unreachable (a
  // write: only while it cannot have been applied, Note [etcd over gRPC]).
  enum class Kind { kRead, kWrite };
  absl::Status Call(const char* what, Kind kind,
                    const std::function<grpc::Status(Endpoint&, grpc::ClientContext*)>& call,
                    absl::Time deadline = absl::InfiniteFuture());

  const std::string endpoints_text_;
  std::vector<Endpoint> endpoints_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace varuna

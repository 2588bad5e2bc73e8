#pragma once

// This manager's role among managers (Note [Leader lease] in manager/ha/leader_election.h).
// Alone (no etcd_endpoints) it leads from the start, on SQLite in state_dir. One of several,
// over etcd, it is a standby, which answers UNAVAILABLE naming the leader, until it is elected
// and has loaded the state; it then leads until it cannot renew its lease, and the process
// exits (its unit starts it again, as a standby). Owns the state store (with etcd, guarded by
// the leader's term), the etcd client and the election. Fence, Gate, leading, term and
// Describe may be called from any thread; the rest where ManagerServer calls them.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/net/rpc.h"
#include "manager/ha/etcd_client.h"
#include "manager/ha/etcd_store.h"
#include "manager/ha/leader_election.h"
#include "manager/manager_config.h"
#include "manager/state/state_store.h"
#include "varuna/v1/control.pb.h"

namespace grpc {
class CallbackServerContext;
}

namespace varuna {

class ManagerRole {
 public:
  // `config` outlives the role. Until Open, it is a manager alone without a store.
  explicit ManagerRole(const ManagerConfig& config);
  ~ManagerRole();

  // Opens the state: with etcd_endpoints, etcd (its ports take the cluster's certificates,
  // `tls`, when the manager has them) and the election, whose `on_elected(term)` runs on the
  // election's thread; else SQLite in state_dir.
  absl::Status Open(const TlsConfig& tls, std::function<void(int64_t term)> on_elected);
  // Null until Open succeeded.
  StateStore* store() const { return store_.get(); }
  // Several managers (etcd_endpoints): a standby until elected.
  bool several() const { return several_; }
  // Whether this manager acts: always alone; with etcd, once elected and recovered.
  bool leading() const { return !several_ || ready_; }
  // The leader's term (0 until elected).
  int64_t term() const { return term_; }
  // A leader past its safe time ends the process here (Note [Leader lease]); anyone else passes.
  void Fence() const;
  // OK where this manager acts; else UNAVAILABLE naming the leader (also in the trailing
  // metadata `varuna-leader` of `ctx` when given, which agents and varunactl follow).
  absl::Status Gate(grpc::CallbackServerContext* ctx) const;
  // With etcd: starts campaigning. After the services are up (their gate asks who leads).
  void Campaign();
  // The leader's first acts, on the loop: the store guarded by `term`, then `recover`. A
  // failure of either ends the process (a standby takes over).
  void TakeOver(int64_t term, const std::function<absl::Status()>& recover);
  // ListManagers: who leads, the managers that are up, and the store.
  void Describe(v1::ListManagersResponse* resp) const;
  // Stops campaigning: a leader that stops cleanly hands over at once (its lease revoked).
  void Stop();

 private:
  const ManagerConfig& config_;
  bool several_ = false;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<LeaderElection> election_;
  std::unique_ptr<StateStore> store_;
  EtcdStateStore* etcd_store_ = nullptr;  // store_, with etcd
  std::atomic<bool> ready_{false};        // with etcd: elected and recovered; the services act
  std::atomic<int64_t> term_{0};
};

}  // namespace varuna

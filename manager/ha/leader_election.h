#pragma once

// Leader election among managers on etcd (docs/operations.md "Several managers").
//
// Note [Leader lease]: each manager holds an etcd lease of lease_ttl seconds, kept alive
// every ttl/6, and registers itself under PREFIX/managers/ADDRESS on it. To lead, a manager
// creates PREFIX/leader on its lease in a transaction that succeeds only if the key does not
// exist; the key's create revision is the leader's *term*, which only grows. The leader's
// state writes are transactions guarded by that key still having that create revision
// (manager/ha/etcd_store.h), and every call it makes to an agent carries the term (agents
// refuse an older one). A leader acts only until its *safe time*: ttl - 0.5 s after its last
// successful renewal was sent. Each renewal's call is cut off at the safe time; the manager's
// loop, its services and its calls to agents each check it (`may_act`); and a leader past it,
// or whose guarded write fails or finds another term, is deposed and stops at once (the
// manager process exits; its unit restarts it as a standby). etcd deletes the key only when
// the lease expires, at least a full ttl after it handled the last renewal (which was after
// it was sent; a new etcd leader extends every lease), so a partitioned leader stops at
// least 0.5 s before anyone else can be elected. A campaign whose transaction committed but
// whose answer was lost finds its own lease on the key next time, and leads. When the leader dies,
// its key goes with its lease and a standby wins on its next try (every ttl/6): a takeover takes
// about ttl. A leader that stops cleanly revokes its lease, and a standby takes over at once.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "manager/ha/etcd_client.h"

namespace varuna {

class LeaderElection {
 public:
  struct Leader {
    std::string address;  // "" when none is known
    int64_t term = 0;
  };
  struct Callbacks {
    // This manager leads from now on, with `term`. Called once, on the election thread.
    std::function<void(int64_t term)> on_elected;
    // This manager no longer leads (it must stop acting at once).
    std::function<void(const std::string& why)> on_deposed;
  };
  // `me`: the address clients reach this manager at (what standbys hand out).
  LeaderElection(EtcdClient* etcd, std::string prefix, std::string me, absl::Duration ttl,
                 Callbacks callbacks);
  ~LeaderElection();  // Stop()

  void Start();
  // Stops campaigning; a leader revokes its lease so a standby takes over at once.
  void Stop();

  bool leading() const { return leading_.load(); }
  // Leading, and before the safe time (Note [Leader lease]): what every action checks.
  bool may_act() const;
  Leader leader() const;
  // Why no leader is known or this manager cannot campaign ("" when all is well), e.g. etcd
  // without quorum.
  std::string trouble() const;
  // Managers with a live lease, from the last look (PREFIX/managers/).
  std::vector<std::string> managers() const;
  const std::string& me() const { return me_; }
  const std::string& leader_key() const { return leader_key_; }

 private:
  void Run();
  void Campaign();
  void Lead();
  void SetTrouble(const std::string& why);
  void Elected(int64_t term, absl::Time renewal_sent);
  void SetSafeUntil(absl::Time renewal_sent);

  EtcdClient* const etcd_;
  const std::string prefix_, me_, leader_key_;
  const absl::Duration ttl_;
  const Callbacks callbacks_;
  std::atomic<bool> leading_{false};
  std::atomic<bool> stopping_{false};
  absl::Notification stopped_;
  std::thread thread_;
  int64_t lease_ = 0;
  int64_t registered_lease_ = 0;  // the lease PREFIX/managers/ME was last put with
  std::atomic<int64_t> safe_until_ns_{0};
  int64_t ticks_ = 0;
  absl::Time renewed_ = absl::InfinitePast();
  mutable absl::Mutex mu_;
  Leader leader_ ABSL_GUARDED_BY(mu_);
  std::string trouble_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> managers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace varuna

#pragma once

// The node table: every agent the manager knows, its liveness (ALIVE -> SUSPECT -> DEAD by
// missed heartbeats), and whether it may get work (drained, under a preemption notice, left
// out of the machine_list file: MachineList, machine_list.h). What an agent may register as
// is bounded by PeerLimits (peer_limits.h). It decides nothing about jobs: it tells its
// Listener when a node is lost, leaves, joins, or the schedulable slots change, and the job
// controller (Manager) acts. Runs on the manager's loop thread like the rest of the manager.

#include <algorithm>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "manager/nodes/machine_list.h"
#include "manager/nodes/node_options.h"
#include "manager/nodes/peer_limits.h"
#include "manager/state/state_store.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class NodeTable {
 public:
  struct Node {
    v1::NodeRecord rec;
    absl::Time last_seen;
    bool dead = false;
    bool suspect = false;    // missed heartbeats, or did not answer an RPC: no new work
    int other_running = 0;   // running workers of no active launch, from the last heartbeat
    double probe_score = 0;  // the agent's startup speed probe (Note [Speed probe]); 0 = none
  };

  // A node its jobs must move off.
  struct Gone {
    std::string node;
    // "lost": DEAD after dead_after_missed heartbeats, or its machine source says it is gone
    // (Lose); "drain": drained or removed from machine_list; "notice": a preemption notice.
    std::string kind;
    std::string why;                               // "no heartbeat for 10s", "node a drained", ...
    absl::Duration silent = absl::ZeroDuration();  // "lost": since its last heartbeat
    // Its workers still run and can save at a step boundary (everything but "lost").
    bool graceful() const { return kind != "lost"; }
  };

  // What the job controller hears. Called on the loop thread, from inside NodeTable calls.
  class Listener {
   public:
    virtual ~Listener() = default;
    // A node its jobs must move off (Gone): lost, or leaving while it still runs. One route
    // for both: Manager hands it to JobController::OnNodeGone.
    virtual void OnNodeGone(const Gone& gone) = 0;
    // Registered for the first time or again, back from DEAD, undrained, listed again.
    virtual void OnNodeJoined(const std::string& node, const std::string& how) = 0;
    // Something worth an event record (varunactl events) that needs no action.
    virtual void OnNodeEvent(const std::string& kind, const std::string& node,
                             const std::string& message) = 0;
    // Schedulable slots may have grown: try to place pending jobs.
    virtual void OnSlotsChanged() = 0;
  };

  NodeTable(NodeOptions options, Clock* clock, StateStore* store, Listener* listener);

  // Loads the nodes from the store; each is SUSPECT until it heartbeats again.
  absl::Status Load();

  // Note [Peer limits] (peer_limits.cc): what an agent asks to be is checked and bounded.
  // `idle(name)` says whether a DEAD node has no ranks left (only those are forgotten to make
  // room).
  absl::StatusOr<Node*> Register(const v1::RegisterRequest& req,
                                 const std::function<int(const std::string&)>& used);
  // A heartbeat from `name`: NOT_FOUND if the node is unknown (the agent registers again).
  absl::StatusOr<Node*> Heartbeat(const std::string& name);
  absl::StatusOr<Node*> Drain(const std::string& name, bool undo);
  // A preemption notice, from varunactl or the node's own agent; over when it registers again.
  absl::StatusOr<Node*> Preempt(const std::string& name, const v1::PreemptionNotice& notice);
  // An RPC to the node failed: no new work until it heartbeats again.
  void MarkUnreachable(const std::string& name);
  // DEAD now, not after the missed heartbeats: its machine source (Slurm) says it is gone.
  void Lose(const std::string& name, const std::string& why);
  // Drops a node that is not alive or runs nothing (`used` == 0): a machine source gave it back.
  void Forget(const std::string& name, int used);

  // Liveness by missed heartbeats, machine_list reload, forgetting idle DEAD nodes.
  void Tick(const std::function<int(const std::string&)>& used);

  const Node* Find(const std::string& name) const;
  const std::map<std::string, Node>& all() const { return nodes_; }
  bool Schedulable(const Node& n) const;
  // The heartbeat period for this many nodes (ManagerConfig::HeartbeatPeriodFor); the SUSPECT
  // and DEAD timeouts are counted in it.
  absl::Duration heartbeat_period() const;
  std::string DrainReason(const Node& n) const;  // "" when not draining
  v1::NodeInfo Describe(const Node& n, int used_slots) const;

 private:
  Node* FindMutable(const std::string& name);
  absl::Duration suspect_after() const;
  absl::Duration dead_after() const;
  void Persist(const Node& n);
  // A new machine_list in force: the nodes it adds join, the ones it removes leave.
  void ReloadMachineList(absl::Time now);
  void ForgetDeadNodes(const std::function<int(const std::string&)>& used);

  const NodeOptions config_;
  Clock* const clock_;
  StateStore* const store_;
  Listener* const listener_;
  const PeerLimits limits_;
  MachineList machine_list_;
  std::map<std::string, Node> nodes_;
};

}  // namespace varuna

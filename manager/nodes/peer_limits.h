#pragma once

// What an agent can make the manager keep (Note [Peer limits] in peer_limits.cc): the bounds on
// a registration's name, address, labels and slots, on how many nodes the manager knows, and
// how long it keeps a DEAD one. Owns the bounds, not the nodes: NodeTable asks it before it
// admits a node or forgets one.

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "manager/nodes/node_options.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class PeerLimits {
 public:
  explicit PeerLimits(const NodeOptions& options);

  // The request's own fields: InvalidArgument naming the first one out of bounds.
  absl::Status CheckRequest(const v1::RegisterRequest& req) const;
  // ResourceExhausted when `known` nodes leave no room for a new name (max_nodes).
  absl::Status CheckRoom(size_t known) const;
  // Whether a DEAD node that runs nothing, silent for `silent`, is forgotten (forget_dead_after).
  bool Forgettable(absl::Duration silent) const { return silent >= forget_dead_after_; }

 private:
  const int max_nodes_;
  const int max_slots_per_node_;
  const absl::Duration forget_dead_after_;
};

}  // namespace varuna

#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/time/time.h"

namespace varuna {

// What the node table needs of the manager's configuration (ManagerConfig::node_options(),
// which holds the defaults and the documentation of each field).
struct NodeOptions {
  absl::Duration heartbeat_period;
  int max_heartbeats_per_s = 0;
  int suspect_after_missed = 0;
  int dead_after_missed = 0;
  absl::Duration forget_dead_after;
  std::string machine_list;
  int max_nodes = 0;
  int max_slots_per_node = 0;
  absl::Duration suspect_after() const { return heartbeat_period * suspect_after_missed; }
  // The period agents are told with `nodes` registered: heartbeat_period, or longer so that
  // nodes / period stays at most max_heartbeats_per_s (10,000 agents at 2,000/s: 5 s).
  absl::Duration HeartbeatPeriodFor(size_t nodes) const {
    return std::max(heartbeat_period,
                    absl::Seconds(static_cast<double>(nodes) / max_heartbeats_per_s));
  }
};

}  // namespace varuna

#include "manager/nodes/peer_limits.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/net/rpc.h"

namespace varuna {
namespace {

bool ValidNodeName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

PeerLimits::PeerLimits(const NodeOptions& options)
    : max_nodes_(options.max_nodes),
      max_slots_per_node_(options.max_slots_per_node),
      forget_dead_after_(options.forget_dead_after) {}

// Note [Peer limits]: a registering agent decides what the manager stores (its name, labels,
// slots), so each has a bound; a node that stays DEAD and idle is forgotten after
// forget_dead_after (NodeTable's ForgetDeadNodes), and new names are refused past max_nodes.
absl::Status PeerLimits::CheckRequest(const v1::RegisterRequest& req) const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("register: ", what));
  };
  if (!ValidNodeName(req.name())) {
    return bad("node name must be 1-63 characters of [A-Za-z0-9._-]");
  }
  if (req.name() == "varuna-manager") {
    // The manager's certificate name: a node holding it could command the agents.
    return bad("'varuna-manager' is reserved for the manager's certificate");
  }
  if (req.slots() < 1 || req.slots() > max_slots_per_node_) {
    return bad(
        absl::StrCat("slots is ", req.slots(), "; must be in [1, ", max_slots_per_node_, "]"));
  }
  if (req.address().size() > 255) return bad("address is longer than 255 characters");
  RETURN_IF_ERROR(SplitHostPort(req.address()).status());
  if (req.labels_size() > 32) return bad("more than 32 labels");
  for (const auto& [k, v] : req.labels()) {
    if (!ValidNodeName(k) || v.size() > 256) {
      return bad(absl::StrCat("label '", k.substr(0, 64),
                              "': keys are 1-63 characters of [A-Za-z0-9._-], values at most 256"));
    }
  }
  return absl::OkStatus();
}

absl::Status PeerLimits::CheckRoom(size_t known) const {
  if (static_cast<int>(known) < max_nodes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("register: the manager already knows max_nodes=", max_nodes_, " nodes"));
}

}  // namespace varuna

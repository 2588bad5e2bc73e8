#include "manager/nodes/node_table.h"

#include <sys/stat.h>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/net/rpc.h"
#include "glog/logging.h"

namespace varuna {
namespace {

std::string HostOf(const std::string& address) {
  auto hp = SplitHostPort(address);
  return hp.ok() ? hp->first : address;
}

bool ValidNodeName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

// Note [Peer limits]: a registering agent decides what the manager stores (its name, labels,
// slots), so each has a bound; a node that stays DEAD and idle is forgotten after
// forget_dead_after (ForgetDeadNodes), and new names are refused past max_nodes.
absl::Status ValidateRegistration(const v1::RegisterRequest& req, int max_slots) {
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
  if (req.slots() < 1 || req.slots() > max_slots) {
    return bad(absl::StrCat("slots is ", req.slots(), "; must be in [1, ", max_slots, "]"));
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

NodeTable::NodeTable(NodeOptions options, Clock* clock, StateStore* store, Listener* listener)
    : config_(std::move(options)), clock_(clock), store_(store), listener_(listener) {}

void NodeTable::Persist(const Node& n) {
  absl::Status s = store_->SaveNode(n.rec);
  CHECK(s.ok()) << "cannot persist node " << n.rec.name() << ": " << s.message();
}

absl::Status NodeTable::Load() {
  ASSIGN_OR_RETURN(std::vector<v1::NodeRecord> nodes, store_->LoadNodes());
  const absl::Time now = clock_->Now();
  for (auto& rec : nodes) {
    Node n;
    n.rec = rec;
    // Unconfirmed until it heartbeats; dead if it stays silent for the usual timeout.
    n.last_seen = now - config_.suspect_after();
    n.suspect = true;
    nodes_[rec.name()] = std::move(n);
  }
  return absl::OkStatus();
}

NodeTable::Node* NodeTable::Find(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

const NodeTable::Node* NodeTable::Find(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

absl::StatusOr<NodeTable::Node*> NodeTable::Register(
    const v1::RegisterRequest& req, const std::function<int(const std::string&)>& used) {
  RETURN_IF_ERROR(ValidateRegistration(req, config_.max_slots_per_node));
  if (!nodes_.count(req.name()) && static_cast<int>(nodes_.size()) >= config_.max_nodes) {
    ForgetDeadNodes(used);
    if (static_cast<int>(nodes_.size()) >= config_.max_nodes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "register: the manager already knows max_nodes=", config_.max_nodes, " nodes"));
    }
  }
  // Note [Agent identity] in agent_client.cc: one live node per address, or the manager would
  // send one node's ranks to another. (A renamed agent on the same port waits, retrying,
  // until the old name goes DEAD.)
  for (const auto& [name, other] : nodes_) {
    if (name != req.name() && !other.dead && other.rec.address() == req.address()) {
      return absl::AlreadyExistsError(
          absl::StrCat("register: address ", req.address(), " belongs to live node '", name,
                       "' (one node per address; it is free once that node is DEAD)"));
    }
  }
  auto [it, inserted] = nodes_.try_emplace(req.name());
  Node& n = it->second;
  const bool changed = inserted || n.rec.address() != req.address() || n.rec.slots() != req.slots();
  n.rec.set_name(req.name());
  n.rec.set_address(req.address());
  n.rec.set_slots(req.slots());
  n.rec.mutable_labels()->clear();
  for (const auto& [k, v] : req.labels()) (*n.rec.mutable_labels())[k] = v;
  n.last_seen = clock_->Now();
  if (n.dead || inserted || changed) {
    LOG(INFO) << "node=" << req.name() << " registered address=" << req.address()
              << " slots=" << req.slots() << (n.dead ? " (was DEAD)" : "");
  }
  const bool was_gone = n.dead || inserted;
  n.dead = false;
  n.suspect = false;
  const bool was_noticed = n.rec.has_preemption();
  if (was_noticed) {
    // A registration is a (re)started agent: a new machine under the old name.
    LOG(INFO) << "node=" << req.name() << " registered again; its preemption notice is over";
    n.rec.clear_preemption();
  }
  Persist(n);
  if (was_gone || was_noticed) {
    listener_->OnNodeJoined(req.name(),
                            absl::StrCat(req.slots(), " slots at ", req.address(),
                                         was_noticed ? " (back after a preemption notice)" : ""));
  }
  listener_->OnSlotsChanged();
  return &n;
}

absl::StatusOr<NodeTable::Node*> NodeTable::Heartbeat(const std::string& name) {
  Node* node = Find(name);
  if (node == nullptr) {
    return absl::NotFoundError(absl::StrCat("node '", name, "' is not registered"));
  }
  node->last_seen = clock_->Now();
  if (node->dead || node->suspect) {
    LOG(INFO) << "node=" << name << " heartbeating again (was " << (node->dead ? "DEAD" : "SUSPECT")
              << ")";
    const bool was_dead = node->dead;
    node->dead = node->suspect = false;
    if (was_dead) listener_->OnNodeJoined(name, "heartbeating again after DEAD");
    listener_->OnSlotsChanged();
  }
  return node;
}

absl::StatusOr<NodeTable::Node*> NodeTable::Drain(const std::string& name, bool undo) {
  Node* n = Find(name);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("no node named '", name, "'"));
  if (n->rec.drained() != !undo) {
    n->rec.set_drained(!undo);
    Persist(*n);
    LOG(INFO) << "node=" << name << (undo ? " schedulable again" : " draining");
    listener_->OnNodeEvent(undo ? "node_undrained" : "node_drained", name, "");
    if (undo) {
      listener_->OnNodeJoined(name, "undrained");
      listener_->OnSlotsChanged();
    } else {
      listener_->OnNodeGone({name, "drain", absl::StrCat("node ", name, " drained")});
    }
  }
  return n;
}

absl::StatusOr<NodeTable::Node*> NodeTable::Preempt(const std::string& name,
                                                    const v1::PreemptionNotice& notice) {
  Node* n = Find(name);
  if (n == nullptr) return absl::NotFoundError(absl::StrCat("no node named '", name, "'"));
  if (!n->rec.has_preemption()) {
    *n->rec.mutable_preemption() = notice;
    Persist(*n);
    const std::string when =
        notice.deadline_ms() > 0
            ? absl::StrCat(" (gone in ",
                           absl::FormatDuration(absl::Trunc(
                               absl::FromUnixMillis(notice.deadline_ms()) - clock_->Now(),
                               absl::Seconds(1))),
                           ")")
            : "";
    LOG(WARNING) << "node=" << name << " preemption notice from " << notice.source() << when;
    listener_->OnNodeEvent("preemption_notice", name, absl::StrCat("from ", notice.source(), when));
    listener_->OnNodeGone(
        {name, "notice",
         absl::StrCat("preemption notice for node ", name, " (", notice.source(), ")", when)});
  }
  return n;
}

void NodeTable::MarkUnreachable(const std::string& name) {
  Node* n = Find(name);
  if (n == nullptr || n->dead || n->suspect) return;
  n->suspect = true;
}

void NodeTable::Lose(const std::string& name, const std::string& why) {
  Node* n = Find(name);
  if (n == nullptr || n->dead) return;
  n->dead = true;
  LOG(WARNING) << "node=" << name << " DEAD: " << why;
  listener_->OnNodeGone({name, "lost", why, clock_->Now() - n->last_seen});
}

void NodeTable::Forget(const std::string& name, int used) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || used > 0) return;
  LOG(INFO) << "node=" << name << " forgotten (given back to its machine source)";
  if (absl::Status s = store_->DeleteNode(name); !s.ok()) {
    LOG(WARNING) << "cannot delete node " << name << ": " << s.message();
  }
  nodes_.erase(it);
  listener_->OnNodeEvent("node_forgotten", name, "given back to its machine source");
}

absl::Duration NodeTable::heartbeat_period() const {
  return config_.HeartbeatPeriodFor(nodes_.size());
}
absl::Duration NodeTable::suspect_after() const {
  return heartbeat_period() * config_.suspect_after_missed;
}
absl::Duration NodeTable::dead_after() const {
  return heartbeat_period() * config_.dead_after_missed;
}

bool NodeTable::Schedulable(const Node& n) const {
  return !n.dead && !n.suspect && DrainReason(n).empty();
}

std::string NodeTable::DrainReason(const Node& n) const {
  if (n.rec.drained()) return "drained by request";
  if (n.rec.has_preemption()) {
    return absl::StrCat("preemption notice (", n.rec.preemption().source(), ")");
  }
  if (have_machine_list_ && !listed_.count(n.rec.name()) &&
      !listed_.count(HostOf(n.rec.address()))) {
    return absl::StrCat("not in machine_list ", config_.machine_list);
  }
  return "";
}

v1::NodeInfo NodeTable::Describe(const Node& n, int used_slots) const {
  v1::NodeInfo info;
  info.set_name(n.rec.name());
  info.set_address(n.rec.address());
  info.set_slots(n.rec.slots());
  *info.mutable_labels() = n.rec.labels();
  info.set_used_slots(used_slots);
  info.set_last_heartbeat_age_s(absl::ToDoubleSeconds(clock_->Now() - n.last_seen));
  const std::string drain = DrainReason(n);
  if (n.dead) {
    info.set_state(v1::DEAD);
    info.set_reason("no heartbeat");
  } else if (n.suspect) {
    info.set_state(v1::SUSPECT);
  } else if (!drain.empty()) {
    info.set_state(v1::DRAINING);
    info.set_reason(drain);
  } else {
    info.set_state(v1::ALIVE);
  }
  return info;
}

void NodeTable::ReloadMachineList() {
  if (config_.machine_list.empty()) return;
  struct stat st;
  if (stat(config_.machine_list.c_str(), &st) != 0) {
    if (have_machine_list_ || machine_list_mtime_ != -2) {
      LOG(WARNING) << "machine_list " << config_.machine_list
                   << " cannot be read; every node is treated as draining";
    }
    have_machine_list_ = true;
    listed_.clear();
    machine_list_mtime_ = -2;
    return;
  }
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == machine_list_mtime_) return;
  machine_list_mtime_ = mtime;
  // Non-blocking, bounded, regular files only (common/base/safe_file.h): the loop never waits.
  auto text = ReadRegularFile(config_.machine_list, 1 << 20, "machine_list");
  if (!text.ok()) {
    LOG(WARNING) << text.status().message() << "; every node is treated as draining";
    machine_list_mtime_ = -2;
  }
  std::set<std::string> listed;
  for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n')) {
    std::string host(absl::StripAsciiWhitespace(line));
    if (host.empty() || host[0] == '#') continue;
    listed.insert(host);
  }
  if (listed != listed_ || !have_machine_list_) {
    std::set<std::string> before;
    for (const auto& [name, n] : nodes_) {
      if (DrainReason(n).empty()) before.insert(name);
    }
    have_machine_list_ = true;
    LOG(INFO) << "machine_list " << config_.machine_list << ": " << absl::StrJoin(listed, " ");
    listed_ = std::move(listed);
    listener_->OnNodeEvent("machine_list", "", absl::StrJoin(listed_, " "));
    for (const auto& [name, n] : nodes_) {
      const bool now_listed = DrainReason(n).empty();
      if (before.count(name) && !now_listed) {
        listener_->OnNodeGone(
            {name, "drain", absl::StrCat("node ", name, " removed from machine_list")});
      } else if (!before.count(name) && now_listed) {
        listener_->OnNodeJoined(name, "added to machine_list");
      }
    }
    listener_->OnSlotsChanged();
  }
  have_machine_list_ = true;
}

void NodeTable::ForgetDeadNodes(const std::function<int(const std::string&)>& used) {
  const absl::Time now = clock_->Now();
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const Node& n = it->second;
    if (n.dead && now - n.last_seen >= config_.forget_dead_after && used(n.rec.name()) == 0) {
      LOG(INFO) << "node=" << n.rec.name() << " forgotten (DEAD for "
                << absl::FormatDuration(now - n.last_seen) << ")";
      absl::Status s = store_->DeleteNode(n.rec.name());
      if (!s.ok()) LOG(WARNING) << "cannot delete node " << n.rec.name() << ": " << s.message();
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
}

void NodeTable::Tick(const std::function<int(const std::string&)>& used) {
  const absl::Time now = clock_->Now();
  ForgetDeadNodes(used);
  if (now - last_list_check_ >= absl::Seconds(2)) {
    last_list_check_ = now;
    ReloadMachineList();
  }
  for (auto& [name, n] : nodes_) {
    if (n.dead) continue;
    const absl::Duration silent = now - n.last_seen;
    if (silent >= dead_after()) {
      n.dead = true;
      LOG(WARNING) << "node=" << name << " DEAD: no heartbeat for " << silent;
      listener_->OnNodeGone(
          {name, "lost",
           absl::StrCat("no heartbeat for ",
                        absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100)))),
           silent});
    } else if (silent >= suspect_after() && !n.suspect) {
      n.suspect = true;
      LOG(WARNING) << "node=" << name << " SUSPECT: no heartbeat for " << silent;
    }
  }
}

}  // namespace varuna

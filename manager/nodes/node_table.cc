#include "manager/nodes/node_table.h"

#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace varuna {

NodeTable::NodeTable(NodeOptions options, Clock* clock, StateStore* store, Listener* listener)
    : config_(std::move(options)),
      clock_(clock),
      store_(store),
      listener_(listener),
      limits_(config_),
      machine_list_(config_.machine_list) {}

void NodeTable::Persist(const Node& n) {
  absl::Status s = store_->SaveNode(n.rec);
  CHECK(s.ok()) << "cannot persist node " << n.rec.name() << ": " << s.message();
}

absl::Status NodeTable::Load() {
  ASSIGN_OR_RETURN(std::vector<v1::NodeRecord> nodes, store_->LoadNodes());
  const absl::Time now = clock_->Now();
  for (auto& rec : nodes) {
    // Checked like a registration (Note [Records on load] in manager/jobs/job_table.cc).
    v1::RegisterRequest as_registered;
    as_registered.set_name(rec.name());
    as_registered.set_address(rec.address());
    as_registered.set_slots(rec.slots());
    *as_registered.mutable_labels() = rec.labels();
    if (absl::Status bad = limits_.CheckRequest(as_registered);
        !bad.ok() || nodes_.count(rec.name())) {
      LOG(ERROR) << "state: node record '" << rec.name().substr(0, 64) << "' dropped ("
                 << (bad.ok() ? "a duplicate" : bad.message()) << "); its agent registers again";
      if (!rec.name().empty()) store_->DeleteNode(rec.name()).IgnoreError();
      continue;
    }
    Node n;
    n.rec = rec;
    // Unconfirmed until it heartbeats; dead if it stays silent for the usual timeout.
    n.last_seen = now - config_.suspect_after();
    n.suspect = true;
    nodes_[rec.name()] = std::move(n);
  }
  return absl::OkStatus();
}

NodeTable::Node* NodeTable::FindMutable(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

const NodeTable::Node* NodeTable::Find(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

absl::StatusOr<NodeTable::Node*> NodeTable::Register(
    const v1::RegisterRequest& req, const std::function<int(const std::string&)>& used) {
  RETURN_IF_ERROR(limits_.CheckRequest(req));
  if (!nodes_.count(req.name()) && !limits_.CheckRoom(nodes_.size()).ok()) {
    ForgetDeadNodes(used);
    RETURN_IF_ERROR(limits_.CheckRoom(nodes_.size()));
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
  Node* node = FindMutable(name);
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
  Node* n = FindMutable(name);
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
  Node* n = FindMutable(name);
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
  Node* n = FindMutable(name);
  if (n == nullptr || n->dead || n->suspect) return;
  n->suspect = true;
}

void NodeTable::Lose(const std::string& name, const std::string& why) {
  Node* n = FindMutable(name);
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
  return machine_list_.Excludes(n.rec);
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

void NodeTable::ReloadMachineList(absl::Time now) {
  std::optional<std::set<std::string>> listed = machine_list_.Read(now);
  if (!listed) return;
  std::set<std::string> before;
  for (const auto& [name, n] : nodes_) {
    if (DrainReason(n).empty()) before.insert(name);
  }
  machine_list_.Adopt(*std::move(listed));
  listener_->OnNodeEvent("machine_list", "", absl::StrJoin(machine_list_.hosts(), " "));
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

void NodeTable::ForgetDeadNodes(const std::function<int(const std::string&)>& used) {
  const absl::Time now = clock_->Now();
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const Node& n = it->second;
    if (n.dead && limits_.Forgettable(now - n.last_seen) && used(n.rec.name()) == 0) {
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
  ReloadMachineList(now);
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

// The Cluster group: nodes, drain, preempt.

#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ctl/commands.h"
#include "ctl/session.h"
#include "ctl/varunactl.h"

namespace varuna::ctl {
namespace {

absl::StatusOr<int> RunNodes(Session& s, const ParsedArgs&) {
  v1::ListNodesResponse resp;
  grpc::Status st = s.stub()->ListNodes(s.Context().get(), v1::ListNodesRequest(), &resp);
  if (!st.ok()) return s.CallError(st, "ListNodes");
  if (s.json()) {
    std::vector<std::string> parts;
    for (const auto& n : resp.nodes()) parts.push_back(s.Json(n));
    s.out() << "[" << absl::StrJoin(parts, ",") << "]\n";
    return kExitOk;
  }
  // SPEED: relative to its peers in the jobs it runs (the slowest job's view; "-" when not
  // measured); REASON also says why it is slow or evicted (docs/morphing.md "Stragglers").
  s.out() << absl::StrFormat("%-16s %-22s %-5s %-4s %-9s %-9s %-6s %s\n", "NAME", "ADDRESS",
                             "SLOTS", "USED", "STATE", "HEARTBEAT", "SPEED", "REASON");
  for (const auto& n : resp.nodes()) {
    std::string reason = n.reason();
    if (!n.speed_note().empty()) reason += (reason.empty() ? "" : "; ") + n.speed_note();
    if (!n.source().empty()) reason += (reason.empty() ? "" : "; ") + n.source();
    s.out() << absl::StrFormat(
        "%-16s %-22s %-5d %-4d %-9s %-9s %-6s %s\n", Printable(n.name()), Printable(n.address()),
        n.slots(), n.used_slots(), v1::NodeState_Name(n.state()),
        absl::StrFormat("%.1fs", n.last_heartbeat_age_s()),
        n.relative_speed() > 0 ? absl::StrFormat("%.2f", n.relative_speed()) : "-",
        Printable(reason));
  }
  // Machine sources (Slurm): what they have and want, and why they cannot get it.
  for (const auto& src : resp.sources()) {
    s.out() << "\n"
            << Printable(src.name()) << " (" << Printable(src.detail()) << "): " << src.running()
            << " running, " << src.pending() << " queued"
            << (src.pending_reason().empty() ? "" : " (" + Printable(src.pending_reason()) + ")")
            << ", " << src.wanted() << " wanted\n";
    if (!src.error().empty()) {
      s.out() << "  error"
              << (src.failures() > 0 ? absl::StrFormat(" (%d tries, last %.0fs ago)",
                                                       src.failures(), src.error_age_s())
                                     : std::string())
              << ": " << Printable(src.error()) << "\n";
    }
  }
  return kExitOk;
}

absl::StatusOr<int> RunDrain(Session& s, const ParsedArgs& a) {
  v1::DrainNodeRequest req;
  req.set_undo(a.Has("--undo"));
  req.set_node(a.Get("NODE"));
  v1::DrainNodeResponse resp;
  grpc::Status st = s.stub()->DrainNode(s.Context().get(), req, &resp);
  if (!st.ok()) return s.CallError(st, "DrainNode");
  if (s.json()) {
    s.out() << s.Json(resp.node()) << "\n";
  } else {
    s.out() << "node " << resp.node().name() << " " << v1::NodeState_Name(resp.node().state())
            << "\n";
  }
  return kExitOk;
}

absl::StatusOr<int> RunPreempt(Session& s, const ParsedArgs& a) {
  const std::string in = a.Value("--in");
  absl::Duration d;
  if (!absl::ParseDuration(in, &d) || d < absl::ZeroDuration() || d > absl::Hours(24 * 365)) {
    return UsageError(absl::StrCat("--in needs a duration like 30s or 2m, not '", in, "'"));
  }
  v1::PreemptNodeRequest req;
  req.set_node(a.Get("NODE"));
  req.set_in_ms(absl::ToInt64Milliseconds(d));
  v1::PreemptNodeResponse resp;
  grpc::Status st = s.stub()->PreemptNode(s.Context().get(), req, &resp);
  if (!st.ok()) return s.CallError(st, "PreemptNode");
  if (s.json()) {
    s.out() << s.Json(resp.node()) << "\n";
  } else {
    s.out() << "node " << resp.node().name() << " " << v1::NodeState_Name(resp.node().state())
            << ": " << resp.node().reason() << "\n";
  }
  return kExitOk;
}

absl::StatusOr<int> RunManagers(Session& s, const ParsedArgs&) {
  v1::ListManagersResponse resp;
  grpc::Status st = s.stub()->ListManagers(s.Context().get(), v1::ListManagersRequest(), &resp);
  if (!st.ok()) return s.CallError(st, "ListManagers");
  if (s.json()) {
    s.out() << s.Json(resp) << "\n";
    return kExitOk;
  }
  s.out() << absl::StrFormat("%-28s %-8s %s\n", "ADDRESS", "ROLE", "TERM");
  for (const auto& m : resp.managers()) {
    s.out() << absl::StrFormat("%-28s %-8s %s\n", Printable(m.address()),
                               m.leader() ? "leader" : "standby",
                               m.leader() ? absl::StrCat(m.term()) : "-");
  }
  s.out() << "store: " << Printable(resp.store());
  if (resp.lease_ttl_s() > 0) s.out() << absl::StrFormat(", lease %.0fs", resp.lease_ttl_s());
  s.out() << " (answered by " << Printable(resp.answered_by()) << ")\n";
  if (resp.leader().empty()) {
    s.out() << "no leader elected" << (resp.note().empty() ? "" : ": " + Printable(resp.note()))
            << "\n";
  }
  return kExitOk;
}

}  // namespace

Command NewCmdManagers() {
  Command c;
  c.name = "managers";
  c.group = kGroupCluster;
  c.synopsis = "the managers, which one leads, its term";
  c.help =
      "Lists the managers sharing one etcd (docs/operations.md \"Several managers\"): each\n"
      "one's address, whether it leads or stands by, and the leader's term (it grows with\n"
      "every election). Any manager answers, a standby too. With one manager (SQLite) it\n"
      "is the only one listed. -o json: {\"managers\": [{\"address\", \"leader\", \"term\"}],\n"
      "\"leader\", \"term\", \"store\", ...}.\n";
  c.run = RunManagers;
  return c;
}

Command NewCmdNodes() {
  Command c;
  c.name = "nodes";
  c.group = kGroupCluster;
  c.synopsis = "the agents and their state";
  c.help =
      "Lists every agent the manager knows: name, address, slots and how many are used,\n"
      "state (ALIVE, SUSPECT, DEAD, DRAINING), time since its last heartbeat and the reason\n"
      "for its state.\n";
  c.run = RunNodes;
  return c;
}

Command NewCmdDrain() {
  Command c;
  c.name = "drain";
  c.group = kGroupCluster;
  c.synopsis = "no new work on a node; its jobs checkpoint and move off it";
  c.help =
      "Marks NODE DRAINING: it gets no new work, and the jobs running there checkpoint and\n"
      "morph off it. --undo makes it schedulable again.\n";
  c.args = {Arg("NODE", "NODE")};
  c.flags = {
      Switch("--undo", "make the node schedulable again"),
  };
  c.run = RunDrain;
  return c;
}

Command NewCmdPreempt() {
  Command c;
  c.name = "preempt";
  c.group = kGroupCluster;
  c.synopsis = "a preemption notice by hand: the node's jobs checkpoint and move off it";
  c.help =
      "Gives NODE a preemption notice, as a cloud provider would: the node is DRAINING and\n"
      "its jobs checkpoint at the next step and move off it. The notice is over when the\n"
      "node's agent registers again.\n"
      "\n"
      "Example:\n"
      "  varunactl preempt gpu7 --in 30s\n";
  c.args = {Arg("NODE", "NODE")};
  c.flags = {
      Option("--in", "DURATION", "when the node goes away, e.g. 30s or 2m", "0s"),
  };
  c.run = RunPreempt;
  return c;
}

}  // namespace varuna::ctl

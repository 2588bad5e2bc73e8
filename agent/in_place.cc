// The agent's half of a morph in place (docs/morphing.md "Morph in place"): adopting the
// workers of an older generation and the stopped-process check (the pool of warm standby
// workers is standby_pool.cc). Agent methods, on the agent's event loop like the rest (agent.h).

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "common/base/safe_file.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/launch/worker_protocol.h"
#include "common/net/proto_json.h"
#include "common/net/rpc.h"
#include "glog/logging.h"

namespace varuna {

namespace fs = std::filesystem;

// Note [Frozen workers]: a stopped process (SIGSTOP, a debugger, a cgroup freeze) does not
// fail; its peers only see it go silent, for as long as their timeout_s. The agent reads the
// state from /proc/PID/stat (the field after the parenthesised name) and reports it, so the
// manager can treat the rank as lost at once rather than wait for the peers' timeouts.
bool ProcessStopped(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state == 'T' || state == 't';
}

std::set<int> Agent::Adopt(const v1::LaunchRequest& req, int master_port) {
  std::set<int> adopted;
  if (req.adopt().empty()) return adopted;
  const std::string who = absl::StrCat("job=", req.job_id(), " gen=", req.generation());
  std::map<int, int> local;  // new rank -> local rank
  for (const auto& r : req.ranks()) local[r.rank()] = r.local_rank();
  std::vector<std::pair<Key, Worker>> moved;
  for (const auto& a : req.adopt()) {
    auto it = workers_.find({req.job_id(), a.old_rank()});
    if (it == workers_.end() || !it->second.running ||
        it->second.generation != a.old_generation() || !local.count(a.new_rank())) {
      continue;  // gone meanwhile: a fresh worker joins in its place
    }
    v1::AgentCommand c;
    v1::ReconfigureCommand* r = c.mutable_reconfigure();
    r->set_generation(req.generation());
    r->set_pipelines(req.pipelines());
    r->set_stage_to_rank_map(req.stage_to_rank_map());
    r->set_per_replica_batch(req.per_replica_batch());
    for (int b : req.stage_boundaries()) r->add_stage_boundaries(b);
    r->set_rank(a.new_rank());
    r->set_micro_batch(req.micro_batch());
    r->set_master_addr(req.master_addr());
    r->set_master_port(master_port);
    r->set_schedule(req.schedule());
    r->set_why(req.why());
    c.set_generation(it->second.generation);
    absl::StatusOr<std::string> line = SerializeAgentCommand(c);
    const absl::Status sent =
        line.ok() ? launcher_->SendCommand(it->second.pid, *line) : line.status();
    if (!sent.ok()) {
      LOG(WARNING) << who << " rank " << a.old_rank() << " of generation " << a.old_generation()
                   << " did not take the reconfigure (" << sent.message()
                   << "); a fresh worker replaces it";
      continue;
    }
    Worker w = std::move(it->second);
    workers_.erase(it);
    LOG(INFO) << who << " adopted pid=" << w.pid << " (generation " << w.generation << " rank "
              << w.rank << ") as rank " << a.new_rank();
    w.generation = req.generation();
    w.rank = a.new_rank();
    w.resumed_from = -1;
    w.ready_at = 0;
    w.in_place.Clear();
    w.parked.clear();
    // Its step records not yet acknowledged stay: the new generation continues after the
    // step they end with and never reports them again (the manager takes them under either
    // generation).
    moved.emplace_back(Key{req.job_id(), a.new_rank()}, std::move(w));
    adopted.insert(a.new_rank());
  }
  for (auto& [key, w] : moved) {
    // An older worker filed under the rank this survivor takes (lost, frozen, not adopted)
    // would drop out of the table here, and with it the SIGKILL that Launch sends every
    // older worker left: it goes now (a frozen process would otherwise stay stopped forever).
    auto old = workers_.find(key);
    if (old != workers_.end() && old->second.running && old->second.generation < req.generation()) {
      LOG(INFO) << who << " stops pid " << old->second.pid << " (generation "
                << old->second.generation << " rank " << old->second.rank
                << "): not adopted, its rank is taken";
      launcher_->Signal(old->second.pid, SIGKILL).IgnoreError();
    }
    workers_[key] = std::move(w);
  }
  return adopted;
}

}  // namespace varuna

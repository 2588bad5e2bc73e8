#include "common/planner/simulator.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <utility>

namespace varuna {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::infinity();

// Note [Simulation]: decisions are processed in time order. A stage deciding at time t sees
// every arrival at or before t, because whatever produces it started before t and was
// processed already (arrival times are computed when the producing task starts). A chosen
// task is committed, as in the engine; if its input has not arrived the stage blocks and the
// task starts when the input arrives.
class StepSim {
 public:
  explicit StepSim(const SimInput& in)
      : in_(in), P_(static_cast<int>(in.stages.size())), M_(in.micro_batches), st_(P_) {
    if (in.schedules == nullptr) owned_ = MakeSchedules(in.policy, P_, M_);
    const auto& lists = in.schedules != nullptr ? *in.schedules : owned_;
    for (const Task& t : lists[0]) split_ = split_ || t.kind == TaskKind::kWeight;
    for (int s = 0; s < P_; ++s) {
      st_[s].tasks = &lists[s];
      st_[s].next_fwd = NextForward(*st_[s].tasks, 0);
      st_[s].done.assign(st_[s].tasks->size(), 0);
      st_[s].act_arrival.assign(M_, kUnknown);
      st_[s].grad_arrival.assign(M_, kUnknown);
      st_[s].peak = in.stages[s].static_bytes;
    }
  }

  SimResult Run() {
    for (int s = 0; s < P_; ++s) queue_.push({0.0, s});
    while (!queue_.empty()) {
      auto [t, s] = queue_.top();
      queue_.pop();
      Decide(s, t);
    }
    SimResult r;
    std::vector<double> end(P_);
    for (int s = 0; s < P_; ++s) {
      end[s] = std::max(st_[s].last_end, st_[s].send_done);
      r.pipeline_s = std::max(r.pipeline_s, end[s]);
      r.busy_s.push_back(st_[s].busy);
      r.peak_bytes.push_back(st_[s].peak);
      r.executed.push_back(std::move(st_[s].executed));
    }
    if (P_ > 1 && in_.tied_allreduce_s > 0) {
      const double t = std::max(end[0], end[P_ - 1]) + in_.tied_allreduce_s;
      end[0] = end[P_ - 1] = t;
    }
    r.end_s = end;
    double all = 0, opt = 0, busy = 0;
    for (int s = 0; s < P_; ++s) {
      all = std::max(all, end[s] + in_.stages[s].allreduce_s);
      opt = std::max(opt, in_.stages[s].optimizer_s);
      busy += st_[s].busy;
    }
    if (P_ > 1) all += in_.sync_s;
    r.step_s = all + opt + in_.step_overhead_s;
    r.bubble = r.pipeline_s > 0 ? 1.0 - busy / P_ / r.pipeline_s : 0.0;
    return r;
  }

 private:
  struct Stage {
    const std::vector<Task>* tasks = nullptr;  // MakeSchedules' list (never modified)
    size_t next = 0;
    size_t next_fwd = 0;     // index of the first forward not run yet (size: none)
    std::vector<char> done;  // tasks run ahead of their place (a forward that overtook)
    size_t chosen = 0;       // the task a blocked stage waits to start
    int forwards_done = 0, backwards_done = 0;
    std::vector<double> act_arrival, grad_arrival;
    double link_act = 0, link_grad = 0, send_done = 0, last_end = 0, busy = 0;
    bool blocked = false;
    double blocked_since = 0;
    int stashes = 0, graphs = 0;
    double peak = 0;
    std::vector<Task> executed;
  };

  static size_t NextForward(const std::vector<Task>& tasks, size_t from) {
    while (from < tasks.size() && tasks[from].kind != TaskKind::kForward) ++from;
    return from;
  }

  void Decide(int s, double t) {
    Stage& g = st_[s];
    while (g.next < g.tasks->size() && g.done[g.next]) ++g.next;
    if (g.next == g.tasks->size()) {
      g.last_end = t;
      return;
    }
    // The engine's run-time reordering (Note [Pipeline execution] in
    // worker/engine/pipeline_executor.cc). The engine moves the overtaking forward to the front of
    // the list; here it is run and marked.
    size_t chosen = g.next;
    if ((*g.tasks)[g.next].kind == TaskKind::kRecompute && g.forwards_done < M_) {
      const bool input_ready = s == 0 || g.act_arrival[g.forwards_done] <= t;
      chosen = RecomputeYieldsTo(*g.tasks, g.next, g.grad_arrival[g.backwards_done] <= t,
                                 input_ready, g.next_fwd);
    }
    const double dep = Dependency(s, (*g.tasks)[chosen]);
    if (dep == kUnknown) {
      g.blocked = true;
      g.blocked_since = t;
      g.chosen = chosen;
      return;
    }
    Start(s, chosen, std::max(t, dep));
  }

  double Dependency(int s, const Task& task) const {
    const Stage& g = st_[s];
    if (task.kind == TaskKind::kForward && s > 0) return g.act_arrival[task.micro_batch];
    if (task.kind == TaskKind::kBackward && s < P_ - 1) return g.grad_arrival[task.micro_batch];
    return 0;
  }

  void Start(int s, size_t index, double start) {
    Stage& g = st_[s];
    const SimStage& c = in_.stages[s];
    const Task task = (*g.tasks)[index];
    g.done[index] = 1;
    if (task.kind == TaskKind::kForward) g.next_fwd = NextForward(*g.tasks, index + 1);
    if (in_.record_order) g.executed.push_back(task);
    double dur = 0;
    double transient = 0;
    switch (task.kind) {
      case TaskKind::kForward:
        dur = task.keep_graph ? c.forward_s : c.forward_nograd_s;
        (task.keep_graph ? g.graphs : g.stashes) += 1;
        ++g.forwards_done;
        break;
      case TaskKind::kRecompute:
        dur = c.recompute_s;
        --g.stashes;
        ++g.graphs;
        break;
      case TaskKind::kBackward:
        dur = split_ ? std::max(0.0, c.backward_s - c.weight_s) : c.backward_s;
        transient = c.transient_bytes;
        ++g.backwards_done;
        break;
      case TaskKind::kWeight:
        dur = std::min(c.weight_s, c.backward_s);
        break;
    }
    g.peak = std::max(
        g.peak, c.static_bytes + g.stashes * c.stash_bytes + g.graphs * c.graph_bytes + transient);
    // A graph's activations live until its last backward task.
    if (task.kind == (split_ ? TaskKind::kWeight : TaskKind::kBackward)) --g.graphs;
    const double end = start + dur;
    g.busy += dur;
    if (task.kind == TaskKind::kForward && s < P_ - 1) {
      g.link_act = std::max(end, g.link_act) + c.send_act_s;
      g.send_done = std::max(g.send_done, g.link_act);
      Arrive(s + 1, /*activation=*/true, task.micro_batch, g.link_act);
    } else if (task.kind == TaskKind::kBackward && s > 0) {
      g.link_grad = std::max(end, g.link_grad) + c.send_grad_s;
      g.send_done = std::max(g.send_done, g.link_grad);
      Arrive(s - 1, /*activation=*/false, task.micro_batch, g.link_grad);
    }
    queue_.push({end, s});
  }

  void Arrive(int s, bool activation, int m, double at) {
    Stage& g = st_[s];
    (activation ? g.act_arrival : g.grad_arrival)[m] = at;
    if (!g.blocked) return;
    const Task& waiting = (*g.tasks)[g.chosen];
    const bool match =
        waiting.micro_batch == m &&
        (activation ? waiting.kind == TaskKind::kForward : waiting.kind == TaskKind::kBackward);
    if (!match) return;
    g.blocked = false;
    Start(s, g.chosen, std::max(g.blocked_since, at));
  }

  const SimInput& in_;
  const int P_, M_;
  bool split_ = false;  // the lists have W tasks: B is the input-gradient part only
  std::vector<std::vector<Task>> owned_;  // the task lists when the caller gave none
  std::vector<Stage> st_;
  using Event = std::pair<double, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
};

}  // namespace

SimResult SimulateStep(const SimInput& input) { return StepSim(input).Run(); }

}  // namespace varuna

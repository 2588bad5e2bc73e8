// How long AutoConfig takes to plan one job on a big cluster (docs/benchmarks.md (g)).
//
// Usage: planner_scale [--slots 4,64,512,4096] [--per_node 8] [--layers 96] [--d_model 4096]
//                      [--global_batch 2048] [--memory_gib 80] [--rounds 3]
//                      [--modes manager,rank,curve]
//
// The model is GPT-like (d_model/128 heads, 2048 tokens, 50304 vocab) on the built-in cost
// model; --memory_gib (0 = no limit) rejects shapes that do not fit. Modes are the planner's
// callers: `manager` (the plan a job launches or morphs with: only shapes that could be the
// best are simulated, heterogeneous mixes too, within its budget: ManagerPlanRequest()),
// `rank` (varunactl plan: the near-best alternatives simulated as well, no budget but the 20 M
// tasks) and `curve` (the allocator's throughput curve: the best shape of every width, within
// 0.2 s). Each line is one slot count and mode:
// the median time over the rounds, each round's time, the shapes simulated, bounded and
// rejected, and the best shape. Times are wall-clock around PlanShapes.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"

namespace {

struct Options {
  std::vector<int> slots = {4, 64, 512, 4096};
  int per_node = 8;
  int layers = 96;
  int d_model = 4096;
  int64_t global_batch = 2048;
  double memory_gib = 80;
  int rounds = 3;
  std::vector<std::string> modes = {"manager", "rank", "curve"};
};

bool ParseInt(const std::string& text, int64_t lo, int64_t* out) {
  return absl::SimpleAtoi(text, out) && *out >= lo;
}

// Parses the flags; false (after a message naming the problem) on bad input.
bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "planner_scale: " << flag << " needs a value\n";
      return false;
    }
    const std::string v = argv[++i];
    int64_t n = 0;
    bool ok = true;
    if (flag == "--slots") {
      o->slots.clear();
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        ok = ok && ParseInt(std::string(part), 1, &n);
        o->slots.push_back(static_cast<int>(n));
      }
    } else if (flag == "--per_node") {
      ok = ParseInt(v, 1, &n);
      o->per_node = static_cast<int>(n);
    } else if (flag == "--layers") {
      ok = ParseInt(v, 1, &n);
      o->layers = static_cast<int>(n);
    } else if (flag == "--d_model") {
      ok = ParseInt(v, 128, &n) && n % 128 == 0;
      o->d_model = static_cast<int>(n);
    } else if (flag == "--global_batch") {
      ok = ParseInt(v, 1, &o->global_batch);
    } else if (flag == "--memory_gib") {
      ok = absl::SimpleAtod(v, &o->memory_gib) && o->memory_gib >= 0;
    } else if (flag == "--rounds") {
      ok = ParseInt(v, 1, &n);
      o->rounds = static_cast<int>(n);
    } else if (flag == "--modes") {
      o->modes = absl::StrSplit(v, ',');
      for (const std::string& m : o->modes)
        ok = ok && (m == "manager" || m == "rank" || m == "curve");
    } else {
      std::cerr << "planner_scale: unknown flag " << flag << "\n";
      return false;
    }
    if (!ok) {
      std::cerr << "planner_scale: bad value for " << flag << ": '" << v << "'\n";
      return false;
    }
  }
  return true;
}

varuna::PlanRequest RequestFor(const Options& o, int slots, const std::string& mode) {
  varuna::PlanRequest req;
  req.memory_per_slot = o.memory_gib * (1 << 30);
  for (int left = slots; left > 0; left -= o.per_node) {
    req.slots_per_node.push_back(std::min(left, o.per_node));
  }
  if (mode == "manager") {  // as manager/nodes/placement.cc asks
    req = varuna::ManagerPlanRequest();
    req.memory_per_slot = o.memory_gib * (1 << 30);
    for (int left = slots; left > 0; left -= o.per_node) {
      req.slots_per_node.push_back(std::min(left, o.per_node));
    }
  } else if (mode == "curve") {  // as manager/sharing/sharing_controller.cc asks
    req.all = true;
    req.best_per_width = true;
    req.simulate_within = 1;
    req.max_simulated_tasks = 4'000'000;
    req.budget_s = 0.2;
  }
  return req;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) return 2;
  varuna::JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = o.layers;
  spec.model.d_model = o.d_model;
  spec.model.heads = o.d_model / 128;
  spec.model.seq_len = 2048;
  spec.model.vocab = 50304;
  spec.train.global_batch = o.global_batch;
  spec.parallel.schedule = "auto";
  auto profile = varuna::BuiltinProfile(spec);
  if (!profile.ok()) {
    std::cerr << "planner_scale: " << profile.status() << "\n";
    return 1;
  }
  std::cout << "gpt layers=" << o.layers << " d_model=" << o.d_model
            << " global_batch=" << o.global_batch << " memory=" << o.memory_gib
            << "GiB per_node=" << o.per_node << " rounds=" << o.rounds << "\n";
  for (int slots : o.slots) {
    for (const std::string& mode : o.modes) {
      const varuna::PlanRequest req = RequestFor(o, slots, mode);
      std::vector<double> times;
      std::string result;
      for (int r = 0; r < o.rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        auto set = varuna::PlanShapes(spec, *profile, req);
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (!set.ok()) {  // saying no is planning too: timed the same
          result = "error: " + std::string(set.status().message()).substr(0, 70);
          continue;
        }
        int simulated = 0, bounded = 0;
        for (const auto& p : set->plans()) (p.lower_bound() ? bounded : simulated) += 1;
        const auto& best = set->plans(0);
        result = "simulated=" + std::to_string(simulated) + " bounded=" + std::to_string(bounded) +
                 " rejected=" + std::to_string(set->rejected_size()) + " best=" +
                 (best.heterogeneous()
                      ? best.topology()
                      : std::to_string(best.stages()) + "x" + std::to_string(best.replicas())) +
                 " mb" + std::to_string(best.micro_batch()) + " " + best.schedule() +
                 " step_s=" + std::to_string(best.step_s());
      }
      std::vector<double> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      std::cout << "slots=" << slots << " mode=" << mode
                << " median_s=" << sorted[sorted.size() / 2]
                << " rounds_s=" << absl::StrJoin(times, ",") << " " << result << "\n";
    }
  }
  return 0;
}

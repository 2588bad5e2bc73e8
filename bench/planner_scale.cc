// How long AutoConfig takes to rank every shape for a big cluster (docs/benchmarks.md (g)).
// Usage: planner_scale [SLOTS] [SLOTS_PER_NODE] [LAYERS] [GLOBAL_BATCH] [GIB_PER_SLOT]
// The model is GPT-3-like (d_model 4096, 32 heads, 2048 tokens, 50304 vocab) on the built-in
// cost model; GIB_PER_SLOT (default 80) rejects shapes that do not fit.

#include <cstdlib>
#include <iostream>

#include "common/planner/autoconfig.h"
#include "common/planner/profile.h"

int main(int argc, char** argv) {
  const int slots = argc > 1 ? std::atoi(argv[1]) : 1024;
  const int per_node = argc > 2 ? std::atoi(argv[2]) : 8;
  const int layers = argc > 3 ? std::atoi(argv[3]) : 96;
  const int64_t batch = argc > 4 ? std::atoll(argv[4]) : 2048;
  const double gib = argc > 5 ? std::atof(argv[5]) : 80;
  varuna::JobSpec spec;
  spec.model.kind = "gpt";
  spec.model.layers = layers;
  spec.model.d_model = 4096;
  spec.model.heads = 32;
  spec.model.seq_len = 2048;
  spec.model.vocab = 50304;
  spec.train.global_batch = batch;
  spec.parallel.schedule = "auto";
  auto profile = varuna::BuiltinProfile(spec);
  if (!profile.ok()) {
    std::cerr << profile.status() << "\n";
    return 1;
  }
  varuna::PlanRequest req;
  req.memory_per_slot = gib * (1 << 30);
  for (int left = slots; left > 0; left -= per_node)
    req.slots_per_node.push_back(std::min(left, per_node));
  for (bool all : {false, true}) {
    req.all = all;
    auto set = varuna::PlanShapes(spec, *profile, req);
    if (!set.ok()) {
      std::cerr << set.status() << "\n";
      return 1;
    }
    const auto& best = set->plans(0);
    std::cout << "slots=" << slots << " per_node=" << per_node << " layers=" << layers
              << " global_batch=" << batch << " memory=" << gib << "GiB" << (all ? " --all" : "")
              << ": " << set->plans_size() << " feasible + " << set->rejected_size()
              << " rejected shapes in " << set->planner_s() << " s; best P=" << best.stages()
              << " D=" << best.replicas() << " mb=" << best.micro_batch() << " " << best.schedule()
              << " step " << best.step_s() << " s\n";
  }
  return 0;
}

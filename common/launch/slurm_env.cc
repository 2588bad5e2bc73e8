#include "common/launch/slurm_env.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace varuna {

absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("SLURM_NODELIST '", nodelist, "' is not a host list: ", why));
  };
  if (nodelist.empty()) return bad("empty");
  std::string host;
  for (size_t i = 0; i < nodelist.size(); ++i) {
    const char c = nodelist[i];
    if (c == ',') break;  // the first entry at depth 0 ends here
    if (c == '[') {
      const size_t close = nodelist.find(']', i);
      if (close == std::string::npos) return bad("an unclosed '['");
      // The range's first element: up to the first ',' or '-' inside the brackets.
      const std::string inside = nodelist.substr(i + 1, close - i - 1);
      const std::string first = inside.substr(0, inside.find_first_of(",-"));
      if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
        return bad(absl::StrCat("'[", inside, "]' does not start with a number"));
      }
      host += first;
      i = close;
      continue;
    }
    if (c == ']') return bad("a ']' without '['");
    host.push_back(c);
  }
  if (host.empty()) return bad("no first host");
  return host;
}

std::optional<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node_id) {
  int node = 0;
  for (absl::string_view part : absl::StrSplit(tasks_per_node, ',')) {
    int count = 0, repeat = 1;
    const size_t open = part.find("(x");
    if (!absl::SimpleAtoi(part.substr(0, open), &count)) return std::nullopt;
    if (open != absl::string_view::npos) {
      if (part.back() != ')' ||
          !absl::SimpleAtoi(part.substr(open + 2, part.size() - open - 3), &repeat)) {
        return std::nullopt;
      }
    }
    if (node_id < node + repeat) return count;
    node += repeat;
  }
  return std::nullopt;
}

bool UnderSlurm(const EnvGetter& env) {
  auto set = [&](const char* name) {
    auto v = env(name);
    return v && !v->empty();
  };
  // An srun task: the batch script itself has SLURM_PROCID=0 and the job's task count, but
  // no step.
  return set("SLURM_JOB_ID") && set("SLURM_STEP_ID") && set("SLURM_PROCID");
}

EnvGetter WithSlurmFallback(EnvGetter base) {
  return [base](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> own = base(name);
    if (own && !own->empty()) return own;
    if (!UnderSlurm(base)) return own;
    auto slurm = [&](const char* var) -> std::optional<std::string> {
      auto v = base(var);
      return v && !v->empty() ? v : std::nullopt;
    };
    if (name == "RANK") return slurm("SLURM_PROCID");
    if (name == "WORLD_SIZE") {
      if (auto n = slurm("SLURM_STEP_NUM_TASKS")) return n;
      return slurm("SLURM_NTASKS");
    }
    if (name == "LOCAL_RANK") return slurm("SLURM_LOCALID");
    if (name == "NODE_RANK") return slurm("SLURM_NODEID");
    if (name == "LOCAL_WORLD_SIZE") {
      int node = 0;
      auto id = slurm("SLURM_NODEID");
      auto per = slurm("SLURM_STEP_TASKS_PER_NODE");
      if (!per) per = slurm("SLURM_TASKS_PER_NODE");
      if (!per || (id && !absl::SimpleAtoi(*id, &node))) return std::nullopt;
      if (auto n = SlurmTasksOnNode(*per, node)) return absl::StrCat(*n);
      return std::nullopt;
    }
    if (name == "MASTER_ADDR") {
      // The step's nodes: SLURM_NODELIST stays the whole job's inside a step.
      auto list = slurm("SLURM_STEP_NODELIST");
      if (!list) list = slurm("SLURM_NODELIST");
      if (!list) list = slurm("SLURM_JOB_NODELIST");
      if (!list) return std::nullopt;
      // A malformed list is left to the default address, named by the caller's error.
      absl::StatusOr<std::string> first = FirstSlurmHost(*list);
      return first.ok() ? std::optional<std::string>(*first) : std::nullopt;
    }
    if (name == "MASTER_PORT") {
      auto id = slurm("SLURM_JOB_ID");
      int64_t job = 0;
      if (!id || !absl::SimpleAtoi(*id, &job) || job < 0) return std::nullopt;
      return absl::StrCat(15000 + job % 10000);
    }
    return own;
  };
}

}  // namespace varuna

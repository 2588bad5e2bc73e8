#include "common/launch/launch_contract.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/launch/worker_protocol.h"

namespace varuna {

RankProcess RankContract(const LaunchContract& c, int rank, int local_rank,
                         const std::string& progress_file,
                         std::map<std::string, std::string> base_env) {
  RankProcess p;
  std::map<std::string, std::string>& env = p.env;
  env = std::move(base_env);
  if (!env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  env["WORLD_SIZE"] = absl::StrCat(c.world_size);
  env["LOCAL_WORLD_SIZE"] = absl::StrCat(c.local_world_size);
  env["MASTER_ADDR"] = c.master_addr;
  env["MASTER_PORT"] = absl::StrCat(c.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(c.generation - 1);
  env["VARUNA_JOB_ID"] = c.job_id;
  env["VARUNA_JOB_NAME"] = c.job_name;
  env["VARUNA_GENERATION"] = absl::StrCat(c.generation);
  env["VARUNA_JOB_SPEC"] = c.spec_path;
  env["VARUNA_NODE"] = c.node;
  if (!c.resume_step.empty()) env["VARUNA_RESUME_STEP"] = c.resume_step;
  if (!c.why.empty()) env["VARUNA_GENERATION_WHY"] = c.why;
  if (!c.node_addr.empty()) env["VARUNA_NODE_ADDR"] = c.node_addr;
  env["RANK"] = absl::StrCat(rank);
  env["LOCAL_RANK"] = absl::StrCat(local_rank);
  env[kProgressFileEnv] = progress_file;

  const bool worker = c.entrypoint.empty();
  std::vector<std::string>& argv = p.argv;
  if (worker) {
    argv = {c.worker_binary, "--job", c.spec_path};
  } else {
    argv.assign(c.entrypoint.begin(), c.entrypoint.end());
  }
  // Varuna's launcher arguments (ARCHITECTURE "Job spec").
  argv.push_back(absl::StrCat("--rank=", rank));
  argv.push_back(absl::StrCat("--local_rank=", local_rank));
  if (c.pipelines.empty()) {
    argv.push_back(absl::StrCat("--stage_to_rank_map=", c.stage_to_rank_map));
    argv.push_back(absl::StrCat("--chunk_size=", c.micro_batch));
    argv.push_back(absl::StrCat("--batch-size=", c.per_replica_batch));
  } else {
    // Heterogeneous pipelines (docs/heterogeneous.md): each pipeline's share is in the text.
    argv.push_back(absl::StrCat("--pipelines=", c.pipelines));
    argv.push_back(absl::StrCat("--chunk_size=", c.micro_batch));
    env["VARUNA_PIPELINES"] = c.pipelines;
  }
  if (worker && !c.resume_step.empty() && !c.join_in_place) {
    argv.push_back(absl::StrCat("--resume_step=", c.resume_step));
  }
  if (worker && c.in_place) {
    argv.push_back("--in_place");
    if (c.join_in_place) argv.push_back("--join_in_place");
  }
  // The plan (docs/autoconfig.md): flags for varuna-worker, the environment for programs of
  // the user's, which may not know the flags.
  const std::string bounds = absl::StrJoin(c.stage_boundaries, ",");
  if (worker) {
    if (!c.schedule.empty()) argv.push_back(absl::StrCat("--schedule=", c.schedule));
    if (!bounds.empty()) argv.push_back(absl::StrCat("--stage_boundaries=", bounds));
    if (c.tp_size > 0) argv.push_back(absl::StrCat("--tp_size=", c.tp_size));
    if (c.profile) argv.push_back(absl::StrCat("--profile_out=", c.gen_dir, "/profile.json"));
  } else {
    if (!c.schedule.empty()) env["VARUNA_SCHEDULE"] = c.schedule;
    if (!bounds.empty()) env["VARUNA_STAGE_BOUNDARIES"] = bounds;
    if (c.tp_size > 0) env["VARUNA_TP_SIZE"] = absl::StrCat(c.tp_size);
  }
  return p;
}

std::map<std::string, std::string> RegroupEnvironment(int world_size, int rank,
                                                      const std::string& master_addr,
                                                      int master_port, int generation) {
  return {{"WORLD_SIZE", absl::StrCat(world_size)},
          {"RANK", absl::StrCat(rank)},
          {"MASTER_ADDR", master_addr},
          {"MASTER_PORT", absl::StrCat(master_port)},
          {"VARUNA_GENERATION", absl::StrCat(generation)},
          {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(generation - 1)}};
}

}  // namespace varuna

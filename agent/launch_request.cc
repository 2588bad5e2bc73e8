#include "agent/launch_request.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/pipeline/topology.h"

namespace varuna {

namespace fs = std::filesystem;

absl::Status ValidateLaunch(const v1::LaunchRequest& req, int slots, const std::string& node) {
  if (req.job_id().empty() || req.job_id().size() > 64 ||
      req.job_id().find('/') != std::string::npos || req.job_id().find("..") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: bad job id '", req.job_id().substr(0, 64), "'"));
  }
  if (req.ranks_size() > slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: ", req.ranks_size(), " ranks for a node of ", slots, " slots"));
  }
  if (req.generation() < 1) return absl::InvalidArgumentError("launch: generation must be >= 1");
  if (req.ranks().empty()) return absl::InvalidArgumentError("launch: no ranks");
  if (req.world_size() < 1) return absl::InvalidArgumentError("launch: world_size must be >= 1");
  // Tensor parallelism: world_size counts processes, the map and pipelines positions.
  if (req.tp_size() < 0 || req.tp_size() > 64 ||
      (req.tp_size() > 1 && req.world_size() % req.tp_size() != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("launch: tp_size ", req.tp_size(),
                                                   " does not divide world_size ", req.world_size(),
                                                   " (or is not in [0, 64])"));
  }
  const int tp = std::max(1, req.tp_size());
  for (const auto& r : req.ranks()) {
    if (r.rank() < 0 || r.rank() >= req.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("launch: rank ", r.rank(), " outside world of ", req.world_size()));
    }
  }
  if (req.spec_yaml().empty()) return absl::InvalidArgumentError("launch: empty job spec");
  if (!req.code_dir().empty()) {
    std::error_code cec;
    if (!fs::is_directory(req.code_dir(), cec)) {
      return absl::FailedPreconditionError(absl::StrCat("launch: code_dir '", req.code_dir(),
                                                        "' is not a directory on node ", node));
    }
  }
  if (!req.resume_step().empty() && !ParseResumeStep(req.resume_step()).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch: resume_step '", req.resume_step().substr(0, 32), "' is invalid"));
  }
  if (!req.pipelines().empty()) {
    if (auto t = Topology::Parse(req.pipelines());
        !t.ok() || t->world_size() * tp != req.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("launch: pipelines '", req.pipelines().substr(0, 64), "' are invalid",
                       t.ok() ? absl::StrCat(" for world size ", req.world_size())
                              : absl::StrCat(": ", t.status().message())));
    }
  }
  return absl::OkStatus();
}

LaunchContract ContractOf(const v1::LaunchRequest& req) {
  LaunchContract contract;
  contract.job_id = req.job_id();
  contract.job_name = req.job_name();
  contract.generation = req.generation();
  contract.world_size = req.world_size();
  contract.local_world_size = req.ranks_size();
  contract.master_addr = req.master_addr();
  contract.stage_to_rank_map = req.stage_to_rank_map();
  contract.pipelines = req.pipelines();
  contract.micro_batch = req.micro_batch();
  contract.per_replica_batch = req.per_replica_batch();
  contract.schedule = req.schedule();
  contract.stage_boundaries.assign(req.stage_boundaries().begin(), req.stage_boundaries().end());
  contract.tp_size = req.tp_size();
  contract.resume_step = req.resume_step();
  contract.why = req.why();
  contract.in_place = req.in_place();
  contract.join_in_place = req.join_in_place();
  contract.profile = req.profile();
  contract.entrypoint.assign(req.entrypoint().begin(), req.entrypoint().end());
  return contract;
}

absl::StatusOr<std::string> WorkerUser(const v1::LaunchRequest& req,
                                       const std::vector<std::string>& allowed_worker_users,
                                       const UidRange& allowed_worker_uids, bool allow_root_workers,
                                       const std::string& worker_user) {
  if (!req.run_as_user().empty()) {
    const auto& ok = allowed_worker_users;
    if (std::find(ok.begin(), ok.end(), req.run_as_user()) == ok.end()) {
      return absl::PermissionDeniedError(absl::StrCat("this agent does not run workers as '",
                                                      req.run_as_user(),
                                                      "' (not in its --allowed_worker_users)"));
    }
    return req.run_as_user();
  }
  if (req.run_as_uid() != 0) {
    if (!allowed_worker_uids.Contains(req.run_as_uid())) {
      return absl::PermissionDeniedError(absl::StrCat(
          "this agent does not run workers as uid ", req.run_as_uid(),
          " (the tenant's; not in its --allowed_worker_uids ", allowed_worker_uids.ToString(),
          ", which should match the manager's tenant_uids)"));
    }
    return absl::StrCat("#", req.run_as_uid());
  }
  return allow_root_workers ? std::string() : worker_user;
}

}  // namespace varuna

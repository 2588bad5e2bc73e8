#pragma once

// A LaunchRequest as the agent reads it (Agent::Launch): what it checks before it touches
// anything (ids, ranks and world, tensor-parallel size, pipelines, resume step, code_dir; one
// clear error naming the field, no side effects beyond looking at code_dir), and the launch
// contract it asks for (common/launch/launch_contract.h).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/launch/launch_contract.h"
#include "common/launch/tenant_uid.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

absl::Status ValidateLaunch(const v1::LaunchRequest& req, int slots, const std::string& node);

// The request's part of the contract; the agent adds what is its own (the port, the paths,
// the node, the worker binary).
LaunchContract ContractOf(const v1::LaunchRequest& req);

// Note [Worker user]: a job's program is the submitter's code, so an agent running as root
// (as a systemd service does) never hands it root by default. Workers run as the Unix user
// the submitter's token maps to (`NAME TOKEN USER` in the manager's tokens file; it comes in
// the launch request) if this agent's --allowed_worker_users lists it; else, with a tokens
// file, as the tenant's own uid (Note [Tenant uids] in common/launch/tenant_uid.cc) if it is
// in --allowed_worker_uids ("#UID" below); else (no tokens: a one-user cluster) as
// --worker_user (default `varuna`, which scripts/install_deps.sh creates). Root only with
// --allow_root_workers, which also makes workers without a token user or uid run as the
// agent itself. An agent that is not root runs workers as itself (a Slurm job step, a user's
// own agent): it could not switch anyway. The launcher gives the generation's directory
// and control FIFO to that user; the agent keeps the logs and reads what the workers write
// as untrusted (common/base/safe_file.h). A standby taking the launch (Note [Standby
// workers] in worker/runtime/standby.cc) drops to the same user first.
// Returns the user to run the request's workers as ("" = the agent's own user; "#UID" a
// tenant's uid), or PermissionDenied naming the user or uid the request asked for.
absl::StatusOr<std::string> WorkerUser(const v1::LaunchRequest& req,
                                       const std::vector<std::string>& allowed_worker_users,
                                       const UidRange& allowed_worker_uids, bool allow_root_workers,
                                       const std::string& worker_user);

}  // namespace varuna

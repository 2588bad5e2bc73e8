#pragma once

// What a caller may do with the job API (Note [Roles] in access.cc): one decision for the
// gRPC services and the HTTP API alike.

#include <string>

#include "absl/status/status.h"
#include "manager/api/tokens.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

enum class ApiAction {
  kView,         // the cluster as squeue and sinfo show it: jobs' summaries, nodes, managers,
                 // plans, profiles
  kSubmit,       // a job of one's own
  kReadJob,      // one job's logs, metrics, events, stages and full record
  kCancelJob,    // one job
  kManageNodes,  // drain, undrain, preempt
};

// OK, or PERMISSION_DENIED naming the role or the owner needed. `owner` is the job's
// submitted_by (job actions only).
absl::Status Authorize(const TokenTable::Caller& caller, ApiAction action,
                       const std::string& job_id = "", const std::string& owner = "");

// Whether `caller` may read all of `job` (its owner or an admin).
bool MayReadJob(const TokenTable::Caller& caller, const v1::JobInfo& job);

// What a caller who may not read `job` still sees of it: id, name, owner, state, size, steps
// and times (as squeue shows them); the reason, the rendezvous address, the morph history,
// the loss and the Unix user are cleared.
void RedactForOthers(v1::JobInfo* job);

}  // namespace varuna

#include "manager/api/access.h"

#include "absl/strings/str_cat.h"

namespace varuna {

// Note [Roles]: a tokens file whose lines say admin or user (NAME TOKEN USER|- ROLE) splits
// what tokens may do, as a batch system does between its operators and its users. Everyone
// sees the cluster as squeue and sinfo show it (every job's id, name, owner, state, size and
// progress; the nodes), submits, plans and reads profiles. A user reads (logs, metrics,
// events, stages, the full record) and cancels only the jobs its token name submitted; an
// admin does anything, and only an admin drains, undrains or preempts nodes. What a user may
// not read of another's job is cleared from it (RedactForOthers), not refused, so listings
// work. Without a tokens file, or with one in which no line says admin, every caller is an
// admin (TokenTable), which is how the manager behaved before roles. Refusals are
// PERMISSION_DENIED (HTTP 403) naming the role or owner needed.
namespace {

const char* ActionName(ApiAction a) {
  switch (a) {
    case ApiAction::kView:
      return "viewing the cluster";
    case ApiAction::kSubmit:
      return "submitting";
    case ApiAction::kReadJob:
      return "reading a job's logs, metrics, events and record";
    case ApiAction::kCancelJob:
      return "cancelling a job";
    case ApiAction::kManageNodes:
      return "draining or preempting a node";
  }
  return "this";
}

}  // namespace

absl::Status Authorize(const TokenTable::Caller& caller, ApiAction action,
                       const std::string& job_id, const std::string& owner) {
  if (caller.role == TokenTable::Role::kAdmin) return absl::OkStatus();
  switch (action) {
    case ApiAction::kView:
    case ApiAction::kSubmit:
      return absl::OkStatus();
    case ApiAction::kReadJob:
    case ApiAction::kCancelJob:
      if (!owner.empty() && owner == caller.name) return absl::OkStatus();
      return absl::PermissionDeniedError(absl::StrCat(
          ActionName(action), " needs its owner or the admin role: job ", job_id,
          " was submitted by '", owner, "', the token is '", caller.name, "' (role user)"));
    case ApiAction::kManageNodes:
      return absl::PermissionDeniedError(absl::StrCat(ActionName(action),
                                                      " needs the admin role: the token '",
                                                      caller.name, "' has the user role"));
  }
  return absl::PermissionDeniedError("unknown action");
}

bool MayReadJob(const TokenTable::Caller& caller, const v1::JobInfo& job) {
  return Authorize(caller, ApiAction::kReadJob, job.id(), job.submitted_by()).ok();
}

void RedactForOthers(v1::JobInfo* job) {
  job->clear_reason();
  job->clear_master();
  job->clear_morphs();
  job->clear_loss();
  job->clear_run_as_user();
  job->clear_run_as_uid();
  job->clear_cancelled_by();
}

}  // namespace varuna

#include "manager/jobs/job_admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace varuna {

JobAdmission::JobAdmission(const JobOptions& options, const JobTable* jobs)
    : stragglers_(options.stragglers),
      max_pending_jobs_per_user_(options.max_pending_jobs_per_user),
      classes_(options.priority_classes),
      submit_above_normal_(options.submit_above_normal),
      jobs_(jobs) {}

absl::StatusOr<JobSpec> JobAdmission::Admit(const v1::SubmitRequest& req) {
  if (req.request_id().size() > 128) {
    return absl::InvalidArgumentError("submit: request_id is longer than 128 characters");
  }
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec_yaml()));
  RETURN_IF_ERROR(spec.ValidateShape());
  if (req.profile() && !spec.entrypoint.empty()) {
    return absl::InvalidArgumentError(
        "a profile job runs varuna-worker's profiler: remove the job's entrypoint");
  }
  // Profiles are measured unsplit; the planner derives a tp group's costs from them (Note
  // [Tensor-parallel plans] in common/planner/tp_plan.cc). The launch says --tp_size 1.
  if (req.profile()) spec.parallel.tp_size = 1;
  if (!spec.env_file.empty()) {
    return absl::InvalidArgumentError(
        "job spec: env_file must be resolved by the submitter (varunactl merges it into env)");
  }
  return spec;
}

absl::Status JobAdmission::Check(const JobSpec& spec, const std::string& user, bool admin) const {
  // Sharing: the class must be one of the cluster's, and one above normal is not for everyone
  // (it shrinks or evicts other users' jobs).
  const auto rank = std::find(classes_.begin(), classes_.end(), spec.priority);
  if (rank == classes_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: priority '", spec.priority,
                                                   "' is not a class of this cluster (",
                                                   absl::StrJoin(classes_, ", "), ")"));
  }
  const auto normal = std::find(classes_.begin(), classes_.end(), "normal");
  if (rank < normal && !admin &&
      std::find(submit_above_normal_.begin(), submit_above_normal_.end(), user) ==
          submit_above_normal_.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("submit: ", user.empty() ? "this caller" : absl::StrCat("user '", user, "'"),
                     " may not submit priority '", spec.priority,
                     "' (classes above normal: admin tokens and sharing.submit_above_normal)"));
  }
  // The job's stragglers: settings with the manager's defaults filled in must still agree
  // (recovered_above above slow_below).
  RETURN_IF_ERROR(ValidateStragglers(ResolveStragglers(spec.stragglers, stragglers_),
                                     "stragglers (with the manager's defaults)", true));
  // Note [Retention] in job_table.cc: one submitter cannot queue without bound.
  int pending = 0;
  for (const auto& [id, j] : jobs_->all()) {
    pending += j.info().state() == v1::PENDING && j.info().submitted_by() == user;
  }
  if (pending >= max_pending_jobs_per_user_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("submit: ", user.empty() ? "the cluster" : absl::StrCat("user '", user, "'"),
                     " already has ", pending, " pending jobs (max_pending_jobs_per_user=",
                     max_pending_jobs_per_user_, "); wait for some to start or cancel them"));
  }
  return absl::OkStatus();
}

}  // namespace varuna

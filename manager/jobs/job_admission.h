#pragma once

// Admission: what a submission may ask for, before its job exists. Off the loop, Admit parses
// the request and checks the spec on its own; on the loop, Check holds it against the manager:
// the job's stragglers settings with the manager's defaults filled in, and how many jobs its
// submitter already has pending. Owns those two bounds (from JobOptions) and reads the job
// table; JobController::Submit asks it before it queues a job.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "manager/jobs/job_options.h"
#include "manager/jobs/job_table.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class JobAdmission {
 public:
  JobAdmission(const JobOptions& options, const JobTable* jobs);

  // What a submit asks for, checked: the request id, the spec parsed (bounded: Note [Alias
  // bombs] in yaml_util.cc) and its shape validated. The server calls it off the loop, so no
  // caller-supplied parsing runs on the loop; any thread may call it.
  static absl::StatusOr<JobSpec> Admit(const v1::SubmitRequest& req);
  // On the loop, for `spec` from Admit: InvalidArgument when its stragglers settings disagree
  // once the manager's defaults fill them in; ResourceExhausted when `user` ("" without
  // tokens) already has max_pending_jobs_per_user pending jobs.
  // InvalidArgument for a priority class the manager does not have; PermissionDenied for a
  // class above normal that `user` (admin: its token's role) may not use.
  absl::Status Check(const JobSpec& spec, const std::string& user, bool admin = true) const;

 private:
  const StragglerSpec stragglers_;  // the manager's defaults
  const int max_pending_jobs_per_user_;
  const std::vector<std::string> classes_;  // highest first
  const std::vector<std::string> submit_above_normal_;
  const JobTable* const jobs_;
};

}  // namespace varuna

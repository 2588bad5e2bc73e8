#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/spec/job_spec.h"

namespace varuna {

// What the job controller needs of the manager's configuration (ManagerConfig::job_options(),
// which holds the defaults and the documentation of each field).
struct JobOptions {
  absl::Duration stop_grace;
  absl::Duration start_timeout;
  int max_pending_jobs_per_user = 0;
  bool morph_in_place = false;
  StragglerSpec stragglers;
  // Sharing (ManagerConfig::sharing): the priority classes, highest first, and the token
  // names besides admins that may submit above normal.
  std::vector<std::string> priority_classes = {"high", "normal", "low"};
  std::vector<std::string> submit_above_normal;
};

}  // namespace varuna

#pragma once

#include "absl/time/time.h"
#include "common/spec/job_spec.h"

namespace varuna {

// What the straggler controller needs of the manager's configuration
// (ManagerConfig::straggler_options(), which holds the defaults and documents each field).
struct StragglerOptions {
  StragglerSpec stragglers;  // what a job's unset stragglers: fields take
  int max_morphs = 0;        // the morph budget the ladder leaves room in
  absl::Duration morph_window;
};

}  // namespace varuna

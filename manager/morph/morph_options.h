#pragma once

#include "absl/time/time.h"

namespace varuna {

// What the morph controller needs of the manager's configuration
// (ManagerConfig::morph_options(), which holds the defaults and documents each field).
struct MorphOptions {
  absl::Duration stop_grace;
  absl::Duration start_timeout;
  absl::Duration morph_save_timeout;
  absl::Duration morph_coalesce;
  absl::Duration scale_up_delay;
  int max_morphs = 0;
  absl::Duration morph_window;
  bool morph_in_place = false;
  // A `sharing:` block: the allocator decides every width, so nodes that join do not grow
  // jobs on their own (CheckGrowth).
  bool allocator_grows = false;
};

}  // namespace varuna

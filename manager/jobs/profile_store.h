#pragma once

// Stored profiles (docs/autoconfig.md), one per model and precision: loaded from the state
// database, added when a profile job reports, used by every plan of that model. Loop
// thread only.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "manager/state/state_store.h"
#include "varuna/v1/control.pb.h"
#include "varuna/v1/plan.pb.h"

namespace varuna {

class ProfileStore {
 public:
  explicit ProfileStore(StateStore* store) : store_(store) {}

  absl::Status Load();
  // The stored profile of the spec's model at its precision, or nullptr.
  const v1::Profile* Find(const JobSpec& spec) const;
  v1::GetProfileResponse Get(const v1::GetProfileRequest& req) const;
  // A profile job's report: parsed, checked against the job's spec, stored. Returns the
  // profile, with `*repeat` true when the same report was already stored (a manager restart
  // makes agents repeat it); an error says why the report is unusable.
  absl::StatusOr<v1::Profile> Store(const std::string& json, const JobSpec& spec, bool* repeat);

 private:
  StateStore* const store_;
  std::map<std::string, v1::Profile> profiles_;  // by "<model key>\n<precision>"
};

}  // namespace varuna

#include "manager/jobs/profile_store.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/planner/profile.h"

namespace varuna {
namespace {

std::string Key(const std::string& model_key, const std::string& precision) {
  return absl::StrCat(model_key, "\n", precision);
}

}  // namespace

absl::Status ProfileStore::Load() {
  ASSIGN_OR_RETURN(std::vector<v1::Profile> profiles, store_->LoadProfiles());
  for (auto& p : profiles) profiles_[Key(p.model_key(), p.precision())] = p;
  return absl::OkStatus();
}

const v1::Profile* ProfileStore::Find(const JobSpec& spec) const {
  auto it = profiles_.find(Key(ModelKey(spec.model), spec.train.precision));
  return it == profiles_.end() ? nullptr : &it->second;
}

v1::GetProfileResponse ProfileStore::Get(const v1::GetProfileRequest& req) const {
  v1::GetProfileResponse resp;
  auto it = profiles_.find(Key(req.model_key(), req.precision()));
  if (it != profiles_.end()) {
    resp.set_found(true);
    *resp.mutable_profile() = it->second;
  }
  return resp;
}

absl::StatusOr<v1::Profile> ProfileStore::Store(const std::string& json, const JobSpec& spec,
                                                bool* repeat) {
  *repeat = false;
  ASSIGN_OR_RETURN(v1::Profile parsed, ParseProfileJson(json));
  RETURN_IF_ERROR(CheckProfileFor(parsed, spec));
  const std::string key = Key(parsed.model_key(), parsed.precision());
  auto it = profiles_.find(key);
  if (it != profiles_.end() && it->second.created_at() == parsed.created_at() &&
      it->second.host() == parsed.host()) {
    *repeat = true;
    return parsed;
  }
  if (absl::Status s = store_->SaveProfile(parsed); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot store the profile of ", parsed.model_key(),
                                               ": ", s.message()));
  }
  profiles_[key] = parsed;
  return parsed;
}

}  // namespace varuna

#include "manager/sharing/sharing_options.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace {

bool ClassNameOk(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

absl::Status Bad(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("manager config: sharing.", key, " ", why));
}

absl::Status ReadShare(const YAML::Node& v, const std::string& what, const std::string& where,
                       UserShare* out) {
  return ForEachEntry(
      v, what, where, [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        const std::string path = absl::StrCat(where, ".", key);
        if (key == "quota_slots") return ReadInto(value, what, path, &out->quota_slots);
        if (key == "weight") return ReadInto(value, what, path, &out->weight);
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": unknown key '", path, "' (known: quota_slots, weight)"));
      });
}

}  // namespace

absl::Status SharingOptions::Validate() const {
  std::set<std::string> seen;
  for (const std::string& c : classes) {
    if (!ClassNameOk(c)) {
      return Bad("classes", absl::StrCat("has '", c, "': a class is 1-32 of a-z, 0-9, _ and -"));
    }
    if (!seen.insert(c).second) return Bad("classes", absl::StrCat("names '", c, "' twice"));
  }
  const int high = ClassRank("high"), normal = ClassRank("normal"), low = ClassRank("low");
  if (high < 0 || normal < 0 || low < 0 || !(high < normal && normal < low)) {
    return Bad("classes", absl::StrCat("is [", absl::StrJoin(classes, ", "),
                                       "]: it must hold high, normal and low in that order "
                                       "(highest first; more classes may go anywhere)"));
  }
  if (period < absl::Seconds(1)) return Bad("period_s", "must be >= 1");
  if (morph_cost_s < 0 || morph_cost_s > 3600) return Bad("morph_cost_s", "must be in [0, 3600]");
  auto check = [](const std::string& who, const UserShare& s) -> absl::Status {
    if (s.quota_slots < 0) return Bad(who, "quota_slots must be >= 0 (0: no quota)");
    if (!(s.weight > 0) || s.weight > 1e6) return Bad(who, "weight must be in (0, 1e6]");
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("default_user", default_user));
  for (const auto& [name, s] : users) {
    if (name.empty()) return Bad("users", "has an empty user name");
    RETURN_IF_ERROR(check(absl::StrCat("users.", name), s));
  }
  return absl::OkStatus();
}

int SharingOptions::ClassRank(const std::string& name) const {
  auto it = std::find(classes.begin(), classes.end(), name);
  return it == classes.end() ? -1 : static_cast<int>(it - classes.begin());
}

bool SharingOptions::MaySubmit(const std::string& name, const std::string& user, bool admin) const {
  if (ClassRank(name) >= ClassRank("normal")) return true;
  return admin || std::find(submit_above_normal.begin(), submit_above_normal.end(), user) !=
                      submit_above_normal.end();
}

AllocPolicy SharingOptions::Policy() const {
  AllocPolicy p;
  p.fair = enabled;
  p.classes = classes;
  p.default_user = default_user;
  p.users = users;
  p.starvation_s = absl::ToDoubleSeconds(starvation);
  p.min_interval_s = absl::ToDoubleSeconds(min_interval);
  p.morph_cost_s = morph_cost_s;
  return p;
}

absl::Status ReadSharing(const YAML::Node& v, const std::string& what, SharingOptions* s) {
  s->enabled = true;
  if (v.IsNull()) return absl::OkStatus();
  return ForEachEntry(
      v, what, "sharing", [&](const std::string& key, const YAML::Node& value) -> absl::Status {
        const std::string path = absl::StrCat("sharing.", key);
        auto seconds = [&](absl::Duration* out) { return ReadSeconds(value, what, path, out); };
        if (key == "classes") return ReadInto(value, what, path, &s->classes);
        if (key == "period_s") return seconds(&s->period);
        if (key == "min_interval_s") return seconds(&s->min_interval);
        if (key == "starvation_s") return seconds(&s->starvation);
        if (key == "morph_cost_s") return ReadInto(value, what, path, &s->morph_cost_s);
        if (key == "default_user") return ReadShare(value, what, path, &s->default_user);
        if (key == "submit_above_normal")
          return ReadInto(value, what, path, &s->submit_above_normal);
        if (key == "users") {
          return ForEachEntry(
              value, what, path, [&](const std::string& user, const YAML::Node& share) {
                return ReadShare(share, what, absl::StrCat(path, ".", user), &s->users[user]);
              });
        }
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": unknown key '", path,
                         "' (known: classes, period_s, min_interval_s, starvation_s, morph_cost_s, "
                         "default_user, users, submit_above_normal)"));
      });
}

}  // namespace varuna

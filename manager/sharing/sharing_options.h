#pragma once

// The manager config's `sharing:` block (docs/operations.md "Sharing a cluster"): priority
// classes, users' quotas and fair-share weights, who may submit above `normal`, and how often
// the allocator re-decides. Without the block the cluster is today's queue plus priorities.

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "manager/sharing/allocator.h"

namespace YAML {
class Node;
}

namespace varuna {

struct SharingOptions {
  bool enabled = false;  // a `sharing:` block was given: fair share decides widths
  std::vector<std::string> classes = {"high", "normal", "low"};  // highest first
  absl::Duration period = absl::Seconds(30);                     // re-decide at least this often
  absl::Duration min_interval = absl::Seconds(60);  // a job is not resized again sooner
  double morph_cost_s = 2;                          // what a resize is assumed to cost
  absl::Duration starvation = absl::Seconds(600);   // a job waiting this long goes first
  UserShare default_user;
  std::map<std::string, UserShare> users;
  // Token names that may submit above `normal` besides admin tokens.
  std::vector<std::string> submit_above_normal;

  // The classes hold high, normal and low in that order, names are [a-z0-9_-]{1,32} and
  // unique; weights > 0, quotas >= 0, times in range.
  absl::Status Validate() const;
  // The rank of `name` (0 = the highest), or -1.
  int ClassRank(const std::string& name) const;
  // Whether `user` (admin: its token's role) may submit a job of class `name`.
  bool MaySubmit(const std::string& name, const std::string& user, bool admin) const;
  AllocPolicy Policy() const;
};

// Reads the `sharing:` block into *out (enabled = true); unknown keys are errors naming them.
absl::Status ReadSharing(const YAML::Node& v, const std::string& what, SharingOptions* out);

}  // namespace varuna

#pragma once

// The machine_list file (ManagerConfig::machine_list): the hosts that may get work, each a
// node name or the host of a node's address. Owns the file's last reading: it is re-read at
// most every 2 s and only when its mtime changed, without blocking and bounded (the loop never
// waits); a file that cannot be read lists nothing, so every node drains. It knows no nodes:
// NodeTable asks it about each one and tells its Listener what a new list changed. The
// manager's loop thread only.

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class MachineList {
 public:
  // `path` "": no list, every node may get work.
  explicit MachineList(std::string path);

  // At most every 2 s (by `now`): reads the file again if its mtime changed. Returns the hosts
  // it lists when they differ from the list in force (the first reading always does); the
  // caller notes which nodes the list in force admits, then Adopt()s them. A file that cannot
  // be stat'ed empties the list in force at once and returns nothing.
  std::optional<std::set<std::string>> Read(absl::Time now);
  // Puts `hosts` (from Read) in force.
  void Adopt(std::set<std::string> hosts);
  // Why the list keeps `rec` from work ("not in machine_list PATH"), or "" when it does not
  // (listed by name or by host, or no list in force).
  std::string Excludes(const v1::NodeRecord& rec) const;
  const std::set<std::string>& hosts() const { return listed_; }

 private:
  const std::string path_;
  bool in_force_ = false;  // read at least once (or found unreadable)
  std::set<std::string> listed_;
  int64_t mtime_ = -1;  // ns; -2: unreadable
  absl::Time checked_ = absl::InfinitePast();
};

}  // namespace varuna

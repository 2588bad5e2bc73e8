#include "manager/nodes/machine_list.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"
#include "common/net/rpc.h"
#include "glog/logging.h"

namespace varuna {
namespace {

std::string HostOf(const std::string& address) {
  auto hp = SplitHostPort(address);
  return hp.ok() ? hp->first : address;
}

}  // namespace

MachineList::MachineList(std::string path) : path_(std::move(path)) {}

std::optional<std::set<std::string>> MachineList::Read(absl::Time now) {
  if (now - checked_ < absl::Seconds(2)) return std::nullopt;
  checked_ = now;
  if (path_.empty()) return std::nullopt;
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    if (in_force_ || mtime_ != -2) {
      LOG(WARNING) << "machine_list " << path_
                   << " cannot be read; every node is treated as draining";
    }
    in_force_ = true;
    listed_.clear();
    mtime_ = -2;
    return std::nullopt;
  }
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_) return std::nullopt;
  mtime_ = mtime;
  // Non-blocking, bounded, regular files only (common/base/safe_file.h): the loop never waits.
  auto text = ReadRegularFile(path_, 1 << 20, "machine_list");
  if (!text.ok()) {
    LOG(WARNING) << text.status().message() << "; every node is treated as draining";
    mtime_ = -2;
  }
  std::set<std::string> listed;
  for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n')) {
    std::string host(absl::StripAsciiWhitespace(line));
    if (host.empty() || host[0] == '#') continue;
    listed.insert(host);
  }
  if (listed == listed_ && in_force_) return std::nullopt;
  return listed;
}

void MachineList::Adopt(std::set<std::string> hosts) {
  in_force_ = true;
  LOG(INFO) << "machine_list " << path_ << ": " << absl::StrJoin(hosts, " ");
  listed_ = std::move(hosts);
}

std::string MachineList::Excludes(const v1::NodeRecord& rec) const {
  if (in_force_ && !listed_.count(rec.name()) && !listed_.count(HostOf(rec.address()))) {
    return absl::StrCat("not in machine_list ", path_);
  }
  return "";
}

}  // namespace varuna

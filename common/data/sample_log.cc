#include "common/data/sample_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace varuna {

SampleLog::~SampleLog() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status SampleLog::Open(const std::string& dir, int rank, int generation,
                             int64_t resumed_from) {
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = absl::StrCat(dir, "/rank-", rank, ".gen-", generation, ".jsonl");
  file_ = std::fopen(path_.c_str(), "ae");
  if (file_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("data.sample_log: cannot open ", path_, ": ", std::strerror(errno)));
  }
  generation_ = generation;
  last_step_ = resumed_from;
  const std::string head =
      absl::StrCat("{\"generation\": ", generation, ", \"resumed_from\": ", resumed_from, "}\n");
  if (std::fputs(head.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    return absl::UnavailableError(absl::StrCat("data.sample_log: writing ", path_, " failed"));
  }
  return absl::OkStatus();
}

absl::Status SampleLog::Append(int64_t step, const std::vector<SampleRef>& refs,
                               const std::vector<std::string>& extra) {
  if (file_ == nullptr) return absl::FailedPreconditionError("sample log not open");
  if (!extra.empty() && extra.size() != refs.size()) {
    return absl::InternalError("sample log: one extra fragment per sample expected");
  }
  std::string lines;
  for (size_t i = 0; i < refs.size(); ++i) {
    const SampleRef& r = refs[i];
    absl::StrAppend(&lines, "{\"step\": ", step, ", \"source\": ", r.source,
                    ", \"sample\": ", r.sample, ", \"epoch\": ", r.epoch, extra.empty() ? "" : ", ",
                    extra.empty() ? "" : extra[i], "}\n");
  }
  if (std::fwrite(lines.data(), 1, lines.size(), file_) != lines.size() ||
      std::fflush(file_) != 0) {
    return absl::UnavailableError(absl::StrCat("data.sample_log: writing ", path_, " failed"));
  }
  last_step_ = step;
  return absl::OkStatus();
}

}  // namespace varuna

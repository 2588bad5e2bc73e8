#include "common/checkpoint_store.h"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace varuna {
namespace fs = std::filesystem;

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/varuna_ckpt_", step);
}

absl::StatusOr<FileDigest> DigestFile(const std::string& root, const std::string& relative) {
  const std::string path = absl::StrCat(root, "/", relative);
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("missing file ", path));
  FileDigest d;
  d.path = relative;
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = f.gcount();
    if (n <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
    d.size += static_cast<uint64_t>(n);
  }
  d.crc32 = static_cast<uint32_t>(crc);
  return d;
}

FileDigest DigestBytes(const std::string& relative, const std::string& bytes) {
  FileDigest d;
  d.path = relative;
  d.size = bytes.size();
  d.crc32 = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                        reinterpret_cast<const Bytef*>(bytes.data()),
                                        static_cast<uInt>(bytes.size())));
  return d;
}

absl::Status SyncFile(const std::string& path) {
  for (const std::string& p : {path, fs::path(path).parent_path().string()}) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      const std::string err = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return absl::InternalError(absl::StrCat("fsync of ", p, " failed: ", err));
    }
    ::close(fd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes, int writer) {
  const std::string tmp = absl::StrCat(path, ".tmp.", writer);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  RETURN_IF_ERROR(SyncFile(tmp));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("rename to ", path, ": ", ec.message()));
  return SyncFile(path);
}

absl::Status WriteManifestAndMarker(const std::string& ckpt_path, int writer,
                                    const std::vector<FileDigest>& files) {
  std::string json = "{\"files\": [";
  for (size_t i = 0; i < files.size(); ++i) {
    absl::StrAppendFormat(&json, "%s\n  {\"path\": \"%s\", \"size\": %d, \"crc32\": %d}",
                          i ? "," : "", files[i].path, files[i].size, files[i].crc32);
  }
  json += "\n]}\n";
  RETURN_IF_ERROR(
      WriteFileAtomic(absl::StrCat(ckpt_path, "/manifest.rank", writer, ".json"), json, writer));
  return WriteFileAtomic(absl::StrCat(ckpt_path, "/complete.rank", writer), "", writer);
}

absl::Status VerifyCheckpoint(const std::string& ckpt_path, bool checksums) {
  YAML::Node common;
  try {
    common = YAML::LoadFile(ckpt_path + "/common.json");
  } catch (const YAML::Exception& e) {
    return absl::DataLossError(absl::StrCat(ckpt_path, "/common.json is missing or unreadable"));
  }
  std::vector<int> writers;
  std::vector<std::string> layers;
  try {
    writers = common["writers"].as<std::vector<int>>();
    layers = common["layers"].as<std::vector<std::string>>();
  } catch (const YAML::Exception& e) {
    return absl::DataLossError(absl::StrCat(ckpt_path, "/common.json lacks writers/layers"));
  }
  std::vector<std::string> covered;
  for (int w : writers) {
    const std::string marker = absl::StrCat(ckpt_path, "/complete.rank", w);
    if (!fs::exists(marker)) {
      return absl::DataLossError(
          absl::StrCat("writer rank ", w, " never finished (no ", marker, ")"));
    }
    YAML::Node manifest;
    try {
      manifest = YAML::LoadFile(absl::StrCat(ckpt_path, "/manifest.rank", w, ".json"));
    } catch (const YAML::Exception&) {
      return absl::DataLossError(absl::StrCat("manifest of writer rank ", w, " is unreadable"));
    }
    for (const auto& f : manifest["files"]) {
      const std::string rel = f["path"].as<std::string>();
      if (!checksums) {
        std::error_code ec;
        const auto size = fs::file_size(absl::StrCat(ckpt_path, "/", rel), ec);
        if (ec || size != f["size"].as<uint64_t>()) {
          return absl::DataLossError(absl::StrCat(rel, " is missing or has the wrong size"));
        }
        covered.push_back(rel);
        continue;
      }
      auto d = DigestFile(ckpt_path, rel);
      if (!d.ok()) return absl::DataLossError(std::string(d.status().message()));
      if (d->size != f["size"].as<uint64_t>()) {
        return absl::DataLossError(absl::StrCat(rel, " has ", d->size, " bytes, manifest says ",
                                                f["size"].as<uint64_t>()));
      }
      if (d->crc32 != f["crc32"].as<uint32_t>()) {
        return absl::DataLossError(absl::StrCat(rel, " fails its checksum"));
      }
      covered.push_back(rel);
    }
  }
  for (const auto& l : layers) {
    const std::string rel = absl::StrCat("layers/", l, ".pt");
    if (std::find(covered.begin(), covered.end(), rel) == covered.end()) {
      return absl::DataLossError(absl::StrCat("no writer recorded ", rel));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> ListCheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step;
    if (e.is_directory() && name.rfind("varuna_ckpt_", 0) == 0 &&
        absl::SimpleAtoi(name.substr(12), &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::vector<int64_t> PruneCheckpoints(const std::string& dir, int keep) {
  std::vector<int64_t> deleted;
  if (keep <= 0) return deleted;
  const auto steps = ListCheckpointSteps(dir);  // newest first
  int complete = 0;
  int64_t oldest_kept = -1;
  for (int64_t step : steps) {
    if (complete < keep && VerifyCheckpoint(CheckpointPath(dir, step), false).ok()) {
      ++complete;
      oldest_kept = step;
    }
  }
  if (oldest_kept < 0) return deleted;
  for (int64_t step : steps) {
    if (step >= oldest_kept) continue;
    std::error_code ec;
    fs::remove_all(CheckpointPath(dir, step), ec);
    if (!ec) deleted.push_back(step);
  }
  return deleted;
}

absl::StatusOr<std::optional<int64_t>> ParseResumeStep(const std::string& value) {
  if (value == "latest") return std::optional<int64_t>();
  int64_t step = 0;
  if (!absl::SimpleAtoi(value, &step) || step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs 'latest' or a step number >= 1, got '", value, "'"));
  }
  return std::optional<int64_t>(step);
}

absl::StatusOr<std::optional<int64_t>> ResolveResumeStep(const std::string& dir,
                                                         std::optional<int64_t> requested) {
  if (requested) {
    const std::string path = CheckpointPath(dir, *requested);
    absl::Status st = VerifyCheckpoint(path);
    if (!st.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", path, " cannot be used: ", st.message()));
    }
    return requested;
  }
  const auto steps = ListCheckpointSteps(dir);
  if (steps.empty()) return std::optional<int64_t>();
  for (int64_t step : steps) {
    absl::Status st = VerifyCheckpoint(CheckpointPath(dir, step));
    if (st.ok()) return std::optional<int64_t>(step);
    LOG(WARNING) << "skipping checkpoint " << CheckpointPath(dir, step) << ": " << st.message();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      dir, " holds ", steps.size(),
      " checkpoint(s) but none is complete; refusing to start over (remove them to start fresh)"));
}

}  // namespace varuna

#include "common/checkpoint/checkpoint_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace fs = std::filesystem;

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/varuna_ckpt_", step);
}

absl::StatusOr<FileDigest> DigestFile(const std::string& root, const std::string& relative,
                                      int64_t expected_size) {
  const std::string path = absl::StrCat(root, "/", relative);
  auto fd = OpenRegularFileBeneath(root, relative, "checkpoint file");
  if (!fd.ok()) {
    if (fd.status().code() == absl::StatusCode::kNotFound) return fd.status();
    return absl::DataLossError(std::string(fd.status().message()));
  }
  struct stat st {};
  if (::fstat(*fd, &st) != 0 || (expected_size >= 0 && st.st_size != expected_size)) {
    ::close(*fd);
    return absl::DataLossError(
        absl::StrCat(relative, " has ", st.st_size, " bytes, manifest says ", expected_size));
  }
  FileDigest d;
  d.path = relative;
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(*fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(*fd);
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
    d.size += static_cast<uint64_t>(n);
  }
  ::close(*fd);
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

namespace {

absl::Status FsyncPath(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string err = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return absl::InternalError(absl::StrCat("fsync of ", p, " failed: ", err));
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::Status SyncFile(const std::string& path) {
  RETURN_IF_ERROR(FsyncPath(path));
  return FsyncPath(fs::path(path).parent_path().string());
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes, int writer) {
  const std::string tmp = absl::StrCat(path, ".tmp.", writer);
  // Whatever is at the temporary name (a FIFO, a symlink someone left) is removed, and the
  // new file is created exclusively without following links, so the write never blocks and
  // never lands elsewhere. The same fd is written and fsynced.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  const std::string err = std::strerror(errno);
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", err));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("rename to ", path, ": ", ec.message()));
  return FsyncPath(fs::path(path).parent_path().string());  // the rename
}

namespace {
std::string FilesJson(const std::vector<FileDigest>& files) {
  std::string json = "[";
  for (size_t i = 0; i < files.size(); ++i) {
    absl::StrAppendFormat(&json, "%s\n  {\"path\": \"%s\", \"size\": %d, \"crc32\": %d}",
                          i ? "," : "", files[i].path, files[i].size, files[i].crc32);
  }
  return json + "\n]";
}
}  // namespace

absl::Status WriteManifestAndMarker(const std::string& ckpt_path, int writer,
                                    const std::vector<FileDigest>& files) {
  const std::string json = absl::StrCat("{\"files\": ", FilesJson(files), "}\n");
  RETURN_IF_ERROR(
      WriteFileAtomic(absl::StrCat(ckpt_path, "/manifest.rank", writer, ".json"), json, writer));
  return WriteFileAtomic(absl::StrCat(ckpt_path, "/complete.rank", writer), "", writer);
}

absl::Status WriteRescueRecord(const std::string& ckpt_path, int rank,
                               const std::string& common_json,
                               const std::vector<FileDigest>& files) {
  const size_t close = common_json.rfind('}');
  if (close == std::string::npos) return absl::InternalError("rescue: bad common JSON");
  const std::string json =
      absl::StrCat(common_json.substr(0, close), ",\n \"files\": ", FilesJson(files), "}\n");
  RETURN_IF_ERROR(
      WriteFileAtomic(absl::StrCat(ckpt_path, "/rescue.rank", rank, ".json"), json, rank));
  return WriteFileAtomic(absl::StrCat(ckpt_path, "/rescued.rank", rank), "", rank);
}

// Note [Rolled rescue]: no state is copied per step to make a rescue possible (Note [Committed
// step] in worker/engine/varuna.cc). When a link fails in the last phase of step S's
// agreement, some survivors applied S and others are at S - 1 with S's agreement posted: their
// reduced gradients of S are still on their parameters, which is all S's update needs besides
// the agreed vote (the skip on overflow, the global gradient norm for the clip). So a rescuer
// at S records that vote in its rescue record (update_skipped, update_grad_norm), and a rescuer
// at S - 1 with S pending writes, besides its own step S - 1, its layers with those gradients
// into S's directory (pending/<layer>.safetensors, recorded in pending.rank<R>.json). Step S
// is then complete when the rescuers at S and the pending layers together cover the model and
// a rescuer recorded the vote; the loader applies the update to the pending layers
// (Checkpointer::Load), which gives the bytes the survivors at S hold (the update is the same
// elementwise arithmetic on the same inputs). Without a rescuer at S nobody has the vote, the
// directory stays incomplete and S - 1, which every survivor then wrote, is the resume point.
// Both records carry the writer's generation: pending layers left by an earlier split at the
// same step (whose directory stayed incomplete) never combine with a later generation's
// update. A rescuer does not rewrite a directory that is already complete, so a later
// generation that failed at S keeps the records that complete it.
absl::Status WritePendingRecord(const std::string& ckpt_path, int rank, int64_t step,
                                int64_t global_batch, const std::vector<std::string>& layers,
                                const std::vector<FileDigest>& files, int64_t generation) {
  std::string json = absl::StrCat("{\"step\": ", step, ", \"global_batch\": ", global_batch,
                                  ", \"generation\": ", generation, ",\n \"layers\": [");
  for (size_t i = 0; i < layers.size(); ++i) {
    absl::StrAppend(&json, i ? ", " : "", "\"", layers[i], "\"");
  }
  absl::StrAppend(&json, "],\n \"files\": ", FilesJson(files), "}\n");
  return WriteFileAtomic(absl::StrCat(ckpt_path, "/pending.rank", rank, ".json"), json, rank);
}

std::string PendingLayerFileOf(const std::string& layer) {
  return absl::StrCat("pending/", layer, ".safetensors");
}

bool RolledLayer(const std::string& ckpt_path, int format, const std::string& layer) {
  std::error_code ec;
  return !fs::exists(absl::StrCat(ckpt_path, "/", LayerFileOf(format, layer)), ec) &&
         fs::exists(absl::StrCat(ckpt_path, "/", PendingLayerFileOf(layer)), ec);
}

namespace {

absl::Status Damaged(const std::string& what) { return absl::DataLossError(what); }

absl::StatusOr<YAML::Node> LoadMetadata(const std::string& path, const std::string& what) {
  auto text = ReadRegularFile(path, kMaxCheckpointMetadataBytes, what);
  if (!text.ok()) return Damaged(std::string(text.status().message()));
  auto node = ParseYaml(*text, what);
  if (!node.ok()) return Damaged(std::string(node.status().message()));
  if (!node->IsMap()) return Damaged(absl::StrCat(what, " is not a JSON object"));
  return node;
}

// Reads common.json[key] as T; DataLoss naming the key if it is missing or of the wrong type.
template <typename T>
absl::StatusOr<T> Get(const YAML::Node& n, const std::string& key, const std::string& what) {
  auto v = YamlAs<T>(n[key], what, key);
  if (!v.ok()) return Damaged(std::string(v.status().message()));
  return v;
}

// The step in a varuna_ckpt_<step> directory name; -1 if the name is not of that form.
int64_t StepOfPath(const std::string& ckpt_path) {
  const std::string name = fs::path(ckpt_path).filename().string();
  int64_t step = -1;
  if (name.rfind("varuna_ckpt_", 0) != 0 || !absl::SimpleAtoi(name.substr(12), &step)) return -1;
  return step;
}

absl::StatusOr<CheckpointCommon> ReadCommonUnguarded(const std::string& ckpt_path,
                                                     const std::string& file = "common.json",
                                                     YAML::Node* doc = nullptr) {
  const std::string what = absl::StrCat(ckpt_path, "/", file);
  ASSIGN_OR_RETURN(YAML::Node n, LoadMetadata(what, what));
  if (doc != nullptr) *doc = n;
  CheckpointCommon c;
  c.format = 1;
  if (n["format"]) {
    ASSIGN_OR_RETURN(c.format, Get<int>(n, "format", what));
    if (c.format < 1 || c.format > kCheckpointFormat) {
      return Damaged(absl::StrCat(what, ": format ", c.format,
                                  " is not one this build reads (1 to ", kCheckpointFormat,
                                  "; a newer varuna wrote it?)"));
    }
  }
  ASSIGN_OR_RETURN(c.step, Get<int64_t>(n, "step", what));
  ASSIGN_OR_RETURN(c.global_batch, Get<int64_t>(n, "global_batch", what));
  ASSIGN_OR_RETURN(c.stages, Get<int>(n, "stages", what));
  ASSIGN_OR_RETURN(c.replicas, Get<int>(n, "replicas", what));
  ASSIGN_OR_RETURN(c.loss_scale, Get<double>(n, "loss_scale", what));
  ASSIGN_OR_RETURN(c.clean_steps, Get<int64_t>(n, "clean_steps", what));
  ASSIGN_OR_RETURN(c.writers, Get<std::vector<int>>(n, "writers", what));
  ASSIGN_OR_RETURN(c.layers, Get<std::vector<std::string>>(n, "layers", what));
  if (n["model_spec"]) {
    ASSIGN_OR_RETURN(c.model_spec, Get<std::string>(n, "model_spec", what));
  }
  if (n["data_position"]) {
    ASSIGN_OR_RETURN(c.data_position, Get<std::string>(n, "data_position", what));
  }
  if (n["tokenizer_dir"]) {
    ASSIGN_OR_RETURN(c.tokenizer_dir, Get<std::string>(n, "tokenizer_dir", what));
  }
  if (n["eval_step"] || n["eval_loss"]) {
    ASSIGN_OR_RETURN(const std::string eval_step, Get<std::string>(n, "eval_step", what));
    ASSIGN_OR_RETURN(const std::string eval_loss, Get<std::string>(n, "eval_loss", what));
    if (!absl::SimpleAtoi(eval_step, &c.eval_step) || c.eval_step < 1 ||
        !absl::SimpleAtod(eval_loss, &c.eval_loss)) {
      return Damaged(absl::StrCat(what, ": eval_step '", eval_step.substr(0, 40),
                                  "' or eval_loss '", eval_loss.substr(0, 40),
                                  "' is not a validation record"));
    }
  }
  if (n["update_skipped"] || n["update_grad_norm"]) {  // Note [Rolled rescue]
    ASSIGN_OR_RETURN(const std::string skipped, Get<std::string>(n, "update_skipped", what));
    ASSIGN_OR_RETURN(const std::string norm, Get<std::string>(n, "update_grad_norm", what));
    if ((skipped != "0" && skipped != "1") || !absl::SimpleAtod(norm, &c.update_grad_norm) ||
        !(c.update_grad_norm >= 0)) {
      return Damaged(absl::StrCat(what, ": update_skipped '", skipped.substr(0, 40),
                                  "' or update_grad_norm '", norm.substr(0, 40),
                                  "' is not an agreed update"));
    }
    c.has_update = true;
    c.update_skipped = skipped == "1";
  }
  if (n["generation"]) {
    ASSIGN_OR_RETURN(const std::string generation, Get<std::string>(n, "generation", what));
    if (!absl::SimpleAtoi(generation, &c.generation) || c.generation < 0) {
      return Damaged(
          absl::StrCat(what, ": generation '", generation.substr(0, 40), "' is not a generation"));
    }
  }
  if (n["pipelines"]) {
    ASSIGN_OR_RETURN(c.pipelines, Get<std::string>(n, "pipelines", what));
  }
  if (n["world"]) {
    ASSIGN_OR_RETURN(c.world, Get<int>(n, "world", what));
    if (c.world < 1 || c.world > 1 << 20) return Damaged(absl::StrCat(what, ": bad world"));
  }
  if (c.step < 1 || c.step > (int64_t{1} << 40))
    return Damaged(absl::StrCat(what, ": bad step ", c.step));
  if (const int64_t named = StepOfPath(ckpt_path); named >= 0 && named != c.step) {
    return Damaged(absl::StrCat(what, " says step ", c.step, " but the directory is step ", named));
  }
  if (c.global_batch < 1) return Damaged(absl::StrCat(what, ": bad global_batch"));
  if (c.stages < 1 || c.replicas < 1 || c.stages > 1 << 20 || c.replicas > 1 << 20) {
    return Damaged(absl::StrCat(what, ": bad stages/replicas"));
  }
  if (!std::isfinite(c.loss_scale) || c.loss_scale <= 0 || c.clean_steps < 0) {
    return Damaged(absl::StrCat(what, ": bad loss_scale/clean_steps"));
  }
  const int64_t world = c.world > 0 ? c.world : static_cast<int64_t>(c.stages) * c.replicas;
  if (c.world == 0) c.world = static_cast<int>(std::min<int64_t>(world, 1 << 30));
  if (c.writers.empty()) return Damaged(absl::StrCat(what, " lists no writers"));
  if (c.layers.empty()) return Damaged(absl::StrCat(what, " lists no layers"));
  std::set<int> writers;
  for (int w : c.writers) {
    if (w < 0 || w >= world || !writers.insert(w).second) {
      return Damaged(absl::StrCat(what, ": writer rank ", w, " is out of range or repeated"));
    }
  }
  std::set<std::string> layers;
  for (const std::string& l : c.layers) {
    if (l.find('/') != std::string::npos || !CheckRelativePathInside(l, "layer").ok() ||
        !layers.insert(l).second) {
      return Damaged(absl::StrCat(what, ": layer name '", l, "' is invalid or repeated"));
    }
  }
  return c;
}

// Ranks with a rescued.rank<R> marker in the checkpoint (Note [Rescue] in worker/), ascending.
std::vector<int> RescuedRanks(const std::string& ckpt_path) {
  std::vector<int> ranks;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int r;
    if (name.rfind("rescued.rank", 0) == 0 && absl::SimpleAtoi(name.substr(12), &r) && r >= 0) {
      ranks.push_back(r);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

}  // namespace

absl::StatusOr<CheckpointCommon> ReadCheckpointCommon(const std::string& ckpt_path) {
  try {  // Note [Parser boundary] (common/spec/submission.cc).
    auto common = ReadCommonUnguarded(ckpt_path);
    if (common.ok()) return common;
    // A checkpoint saved by rescue: the lowest rescuer's record. The records agree on the
    // state's fields; the validation record (eval_step, eval_loss) is each rescuer's newest
    // when it took the state, so two may differ by one validation. The step's agreed update
    // (Note [Rolled rescue]) is the step's, whichever rescuer recorded it.
    std::optional<CheckpointCommon> first;
    for (int r : RescuedRanks(ckpt_path)) {
      auto rescued = ReadCommonUnguarded(ckpt_path, absl::StrCat("rescue.rank", r, ".json"));
      if (!rescued.ok()) continue;
      if (!first) first = *rescued;
      if (rescued->has_update) {
        first->has_update = true;
        first->update_skipped = rescued->update_skipped;
        first->update_grad_norm = rescued->update_grad_norm;
        first->generation = rescued->generation;
        break;
      }
    }
    if (first) return *first;
    return common;
  } catch (const std::exception& e) {
    return Damaged(absl::StrCat(ckpt_path, "/common.json cannot be read: ", e.what()));
  }
}

namespace {

absl::Status CheckExpectedLayers(const CheckpointCommon& common,
                                 const std::vector<std::string>* expected_layers) {
  if (expected_layers == nullptr) return absl::OkStatus();
  const std::set<std::string> have(common.layers.begin(), common.layers.end());
  for (const std::string& l : *expected_layers) {
    if (!have.count(l)) {
      return Damaged(absl::StrCat("has no layer '", l, "' of this model (it holds ",
                                  common.layers.size(), " layers)"));
    }
  }
  if (have.size() != expected_layers->size()) {
    return Damaged(
        absl::StrCat("holds ", have.size(), " layers; this model has ", expected_layers->size()));
  }
  return absl::OkStatus();
}

// Checks every entry of a manifest's `files` list and adds the paths to `covered`.
absl::Status VerifyFiles(const std::string& ckpt_path, const YAML::Node& files,
                         const std::string& what, bool checksums, std::set<std::string>* covered) {
  if (!files.IsSequence()) return Damaged(absl::StrCat(what, " has no files list"));
  for (const auto& f : files) {
    if (!f.IsMap()) return Damaged(absl::StrCat(what, " has an entry that is not an object"));
    ASSIGN_OR_RETURN(std::string rel, Get<std::string>(f, "path", what));
    ASSIGN_OR_RETURN(uint64_t size, Get<uint64_t>(f, "size", what));
    ASSIGN_OR_RETURN(uint32_t crc, Get<uint32_t>(f, "crc32", what));
    if (absl::Status s = CheckRelativePathInside(rel, what); !s.ok()) {
      return Damaged(std::string(s.message()));
    }
    if (size > kMaxCheckpointFileBytes) {
      return Damaged(absl::StrCat(what, ": ", rel, " claims ", size, " bytes"));
    }
    if (!checksums) {
      auto fd = OpenRegularFileBeneath(ckpt_path, rel, "checkpoint file");
      if (!fd.ok()) return Damaged(absl::StrCat(rel, " is missing or not a regular file"));
      struct stat st;
      const bool same = ::fstat(*fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == size;
      ::close(*fd);
      if (!same) return Damaged(absl::StrCat(rel, " has the wrong size"));
    } else {
      auto d = DigestFile(ckpt_path, rel, static_cast<int64_t>(size));
      if (!d.ok()) return Damaged(std::string(d.status().message()));
      if (d->size != size) {
        return Damaged(absl::StrCat(rel, " has ", d->size, " bytes, manifest says ", size));
      }
      if (d->crc32 != crc) return Damaged(absl::StrCat(rel, " fails its checksum"));
    }
    covered->insert(rel);
  }
  return absl::OkStatus();
}

absl::Status CheckLayersCovered(const CheckpointCommon& common,
                                const std::set<std::string>& covered) {
  for (const auto& l : common.layers) {
    const std::string rel = LayerFileOf(common.format, l);
    if (!covered.count(rel)) return Damaged(absl::StrCat("no writer recorded ", rel));
  }
  return absl::OkStatus();
}

absl::Status VerifyUnguarded(const std::string& ckpt_path, bool checksums,
                             const std::vector<std::string>* expected_layers) {
  ASSIGN_OR_RETURN(CheckpointCommon common, ReadCommonUnguarded(ckpt_path));
  RETURN_IF_ERROR(CheckExpectedLayers(common, expected_layers));
  std::set<std::string> covered;
  for (int w : common.writers) {
    const std::string marker = absl::StrCat(ckpt_path, "/complete.rank", w);
    std::error_code marker_ec;
    if (!fs::exists(marker, marker_ec)) {
      return Damaged(absl::StrCat("writer rank ", w, " never finished (no ", marker, ")"));
    }
    const std::string what = absl::StrCat("manifest of writer rank ", w);
    ASSIGN_OR_RETURN(YAML::Node manifest,
                     LoadMetadata(absl::StrCat(ckpt_path, "/manifest.rank", w, ".json"), what));
    RETURN_IF_ERROR(VerifyFiles(ckpt_path, manifest["files"], what, checksums, &covered));
  }
  if (!covered.count("common.json")) return Damaged("no writer recorded common.json");
  return CheckLayersCovered(common, covered);
}

// Counts the layers of consistent pending records (Note [Rolled rescue]) as covered: a layer's
// pending file stands for its file at this step. A damaged record is left out, as a rescuer's.
// `generation`: the update's rescuer's (0: not recorded).
void AddPendingLayers(const std::string& ckpt_path, const CheckpointCommon& common,
                      int64_t generation, bool checksums, std::set<std::string>* covered,
                      std::string* problems) {
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int r;
    if (name.rfind("pending.rank", 0) != 0 || !absl::EndsWith(name, ".json") ||
        !absl::SimpleAtoi(name.substr(12, name.size() - 12 - 5), &r) || r < 0) {
      continue;
    }
    absl::Status st = [&]() -> absl::Status {
      const std::string what = absl::StrCat(ckpt_path, "/", name);
      ASSIGN_OR_RETURN(YAML::Node doc, LoadMetadata(what, what));
      ASSIGN_OR_RETURN(int64_t step, Get<int64_t>(doc, "step", what));
      ASSIGN_OR_RETURN(int64_t batch, Get<int64_t>(doc, "global_batch", what));
      ASSIGN_OR_RETURN(auto layers, Get<std::vector<std::string>>(doc, "layers", what));
      if (step != common.step || batch != common.global_batch) {
        return Damaged(absl::StrCat(name, " is for step ", step, " and global batch ", batch,
                                    ", not ", common.step, " and ", common.global_batch));
      }
      int64_t written_by = 0;
      if (doc["generation"]) {
        ASSIGN_OR_RETURN(written_by, Get<int64_t>(doc, "generation", what));
      }
      if (written_by != 0 && generation != 0 && written_by != generation) {
        return Damaged(absl::StrCat(name, " is from generation ", written_by,
                                    ", the step's update from generation ", generation,
                                    " (left by an earlier split at this step)"));
      }
      std::set<std::string> files;
      RETURN_IF_ERROR(VerifyFiles(ckpt_path, doc["files"], name, checksums, &files));
      for (const std::string& l : layers) {
        if (!files.count(PendingLayerFileOf(l))) {
          return Damaged(absl::StrCat(name, " lists layer ", l, " but not its file"));
        }
      }
      for (const std::string& l : layers) covered->insert(LayerFileOf(common.format, l));
      return absl::OkStatus();
    }();
    if (!st.ok()) absl::StrAppend(problems, problems->empty() ? "" : "; ", st.message());
  }
}

// Complete by rescue (Note [Rescue] in worker/engine/checkpoint.cc): the rescuers that verify agree
// on the step and batch, and their files cover every layer. A rescuer whose record or files
// are damaged is left out; the rest may still cover the model.
absl::Status VerifyRescued(const std::string& ckpt_path, bool checksums,
                           const std::vector<std::string>* expected_layers) {
  const std::vector<int> ranks = RescuedRanks(ckpt_path);
  if (ranks.empty()) return Damaged("no rescue records");
  bool has_update = false;        // a rescuer recorded the step's update
  int64_t update_generation = 0;  // ... in this generation
  std::optional<CheckpointCommon> first;
  std::set<std::string> covered;
  std::string problems;
  for (int r : ranks) {
    const std::string file = absl::StrCat("rescue.rank", r, ".json");
    YAML::Node doc;
    auto c = ReadCommonUnguarded(ckpt_path, file, &doc);
    absl::Status st = c.status();
    if (st.ok() && first &&
        (c->step != first->step || c->global_batch != first->global_batch ||
         c->layers != first->layers || c->format != first->format)) {
      st = Damaged(absl::StrCat(file, " disagrees with the other rescuers"));
    }
    std::set<std::string> mine;
    if (st.ok()) st = VerifyFiles(ckpt_path, doc["files"], file, checksums, &mine);
    if (!st.ok()) {
      absl::StrAppend(&problems, problems.empty() ? "" : "; ", st.message());
      continue;
    }
    if (!first) first = *c;
    if (c->has_update && !has_update) update_generation = c->generation;
    has_update = has_update || c->has_update;
    covered.insert(mine.begin(), mine.end());
  }
  if (!first) return Damaged(absl::StrCat("no usable rescue record (", problems, ")"));
  RETURN_IF_ERROR(CheckExpectedLayers(*first, expected_layers));
  if (has_update) {
    AddPendingLayers(ckpt_path, *first, update_generation, checksums, &covered, &problems);
  }
  absl::Status st = CheckLayersCovered(*first, covered);
  if (!st.ok()) {
    return Damaged(absl::StrCat("rescued by ranks ", ranks.size(), " but ", st.message(),
                                problems.empty() ? "" : absl::StrCat(" (", problems, ")")));
  }
  return absl::OkStatus();
}

absl::Status VerifyAny(const std::string& ckpt_path, bool checksums,
                       const std::vector<std::string>* expected_layers) {
  absl::Status st = VerifyUnguarded(ckpt_path, checksums, expected_layers);
  if (st.ok() || RescuedRanks(ckpt_path).empty()) return st;
  absl::Status rescued = VerifyRescued(ckpt_path, checksums, expected_layers);
  if (rescued.ok()) return rescued;
  return Damaged(absl::StrCat(st.message(), "; and as a rescue: ", rescued.message()));
}

}  // namespace

absl::Status VerifyCheckpoint(const std::string& ckpt_path, bool checksums,
                              const std::vector<std::string>* expected_layers) {
  try {  // Note [Parser boundary] (common/spec/submission.cc).
    return VerifyAny(ckpt_path, checksums, expected_layers);
  } catch (const std::exception& e) {
    return Damaged(absl::StrCat(ckpt_path, " cannot be verified: ", e.what()));
  }
}

std::vector<int64_t> ListCheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step;
    std::error_code type_ec;
    if (it->is_directory(type_ec) && name.rfind("varuna_ckpt_", 0) == 0 &&
        absl::SimpleAtoi(name.substr(12), &step) && step >= 0) {
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
  if (value == "latest" || value == "auto") return std::optional<int64_t>();
  int64_t step = 0;
  if (!absl::SimpleAtoi(value, &step) || step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs 'latest', 'auto' or a step number >= 1, got '", value, "'"));
  }
  return std::optional<int64_t>(step);
}

absl::StatusOr<std::optional<int64_t>> ResolveResumeStep(
    const std::string& dir, std::optional<int64_t> requested,
    const std::vector<std::string>* expected_layers) {
  if (requested) {
    const std::string path = CheckpointPath(dir, *requested);
    absl::Status st = VerifyCheckpoint(path, true, expected_layers);
    if (!st.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", path, " cannot be used: ", st.message()));
    }
    return requested;
  }
  const auto steps = ListCheckpointSteps(dir);
  if (steps.empty()) return std::optional<int64_t>();
  std::string newest_reason;
  for (int64_t step : steps) {
    absl::Status st = VerifyCheckpoint(CheckpointPath(dir, step), true, expected_layers);
    if (st.ok()) return std::optional<int64_t>(step);
    if (newest_reason.empty()) newest_reason = absl::StrCat("step ", step, ": ", st.message());
    LOG(WARNING) << "skipping checkpoint " << CheckpointPath(dir, step) << ": " << st.message();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(dir, " holds ", steps.size(), " checkpoint(s) but none is complete (newest, ",
                   newest_reason, "); refusing to start over (remove them to start fresh)"));
}

std::string LayerFileOf(int format, const std::string& layer) {
  return absl::StrCat("layers/", layer, format == 1 ? ".pt" : ".safetensors");
}

std::string FormatCheckpointCommon(const CheckpointCommon& c,
                                   const std::map<std::string, std::string>& info) {
  std::string json = absl::StrFormat(
      "{\"format\": %d, \"step\": %d, \"global_batch\": %d, \"stages\": %d, \"replicas\": %d,\n"
      " \"world\": %d, \"micro_batch\": %d, \"stage_to_rank_map\": \"%s\", \"pipelines\": "
      "\"%s\",\n \"loss_scale\": %.17g, \"clean_steps\": %d,\n \"writers\": [",
      c.format, c.step, c.global_batch, c.stages, c.replicas, c.world, c.micro_batch,
      c.stage_to_rank_map, c.pipelines, c.loss_scale, c.clean_steps);
  for (size_t i = 0; i < c.writers.size(); ++i) absl::StrAppend(&json, i ? ", " : "", c.writers[i]);
  json += "],\n \"layers\": [";
  for (size_t i = 0; i < c.layers.size(); ++i) {
    absl::StrAppend(&json, i ? ", " : "", "\"", c.layers[i], "\"");
  }
  json += "]";
  for (const auto& [k, v] : info) {
    std::string escaped;
    for (char ch : v) {
      if (ch == '"' || ch == '\\') escaped += '\\';
      escaped += ch == '\n' ? ' ' : ch;
    }
    absl::StrAppend(&json, ",\n \"", k, "\": \"", escaped, "\"");
  }
  json += "}\n";
  return json;
}

}  // namespace varuna

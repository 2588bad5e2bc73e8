#pragma once

// The on-disk checkpoint layout (docs/checkpoints.md), without LibTorch:
//
//   DIR/varuna_ckpt_<step>/            step = optimizer steps completed
//     common.json                      written by rank 0: format, step, config, scaler, spec,
//                                      writers
//     layers/<layer name>.safetensors  one file per layer: parameters, buffers, optimizer state
//                                      (format 2; format 1, still read: layers/<name>.pt, a
//                                      pickled dict)
//     manifest.rank<R>.json            per writer: every file it wrote, size and CRC-32
//     complete.rank<R>                 per writer, written last (after fsync of the rest)
//     rescue.rank<R>.json, rescued.rank<R>   a rescue's record and marker (Note [Rescue])
//     pending/<layer>.safetensors      a rescue of the step before, with this step's gradients
//     pending.rank<R>.json             their record (Note [Rolled rescue])
//
// A checkpoint is complete when common.json parses, every writer it lists has its marker and
// manifest, and every file in every manifest has the recorded size and checksum.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

std::string CheckpointPath(const std::string& dir, int64_t step);

// CRC-32 (zlib) of a file's bytes, and its size.
struct FileDigest {
  std::string path;  // relative to the checkpoint directory
  uint64_t size = 0;
  uint32_t crc32 = 0;
};
// `relative` must stay inside `root`; only a regular file is read, and with expected_size >= 0
// a file of another size is refused before any byte is read.
absl::StatusOr<FileDigest> DigestFile(const std::string& root, const std::string& relative,
                                      int64_t expected_size = -1);
FileDigest DigestBytes(const std::string& relative, const std::string& bytes);

// Writes `bytes` to `path` via a temporary name unique to `writer`, fsyncs, renames.
absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes, int writer);
// fsyncs an existing file (e.g. one written by a library) and its directory.
absl::Status SyncFile(const std::string& path);

// Writes the writer's manifest, then its completeness marker (both atomically, fsynced).
absl::Status WriteManifestAndMarker(const std::string& ckpt_path, int writer,
                                    const std::vector<FileDigest>& files);

// A rescue (Note [Rescue] in worker/engine/checkpoint.cc): `common_json` (common.json's fields,
// with writers [rank]) plus `files` with their digests go to rescue.rank<R>.json, then the
// rescued.rank<R> marker. A checkpoint whose rescuers' files cover every layer is complete.
absl::Status WriteRescueRecord(const std::string& ckpt_path, int rank,
                               const std::string& common_json,
                               const std::vector<FileDigest>& files);

// Note [Rolled rescue] in checkpoint_store.cc: a rank at step `step` - 1 whose agreement of
// `step` was posted but never completed writes its layers with their reduced gradients
// (`files`, each PendingLayerFileOf) into DIR/varuna_ckpt_<step>, then this record,
// pending.rank<R>.json (`global_batch` and `layers` as in common.json).
// `generation`: the writer's (0: not known); a rescuer's record of the step's update names its
// own, and pending layers of another generation (an earlier split at the same step, left
// behind) never count beside it.
absl::Status WritePendingRecord(const std::string& ckpt_path, int rank, int64_t step,
                                int64_t global_batch, const std::vector<std::string>& layers,
                                const std::vector<FileDigest>& files, int64_t generation = 0);
// "pending/<layer>.safetensors": a layer at the step before the checkpoint's, with the
// checkpoint step's gradients as "grad.<parameter>" tensors.
std::string PendingLayerFileOf(const std::string& layer);
// True when the checkpoint at `ckpt_path` holds `layer` only as its pending file (no layer file
// in `format`): a load must roll it forward, and nothing else can read it as that step.
bool RolledLayer(const std::string& ckpt_path, int format, const std::string& layer);

// Limits on what a checkpoint's metadata may claim (a manifest is data, not trusted).
inline constexpr int64_t kMaxCheckpointMetadataBytes = 16 << 20;
inline constexpr uint64_t kMaxCheckpointFileBytes = uint64_t{1} << 40;

// common.json, read and checked: step >= 1 and equal to the directory's, writers and layers
// non-empty, unique and in range, layer names plain. DataLoss naming the problem otherwise.
// The layer files' format this build writes; it reads 1 and 2 (LayerFileOf).
inline constexpr int kCheckpointFormat = 2;

struct CheckpointCommon {
  int format = kCheckpointFormat;  // 1 when common.json has no "format" (none ever lacked it)
  int64_t step = 0;
  int64_t global_batch = 0;
  int stages = 0;
  int replicas = 0;
  int world = 0;          // ranks of the writing run (stages x replicas when uniform)
  std::string pipelines;  // its Topology text (absent in checkpoints from before it existed)
  double loss_scale = 1;
  int64_t clean_steps = 0;
  std::vector<int> writers;
  std::vector<std::string> layers;
  std::string model_spec;
  std::string tokenizer_dir;  // the job's data.tokenizer_dir ("" if none), for export
  // Where a corpus's sample stream stood after this step (worker/engine/data.h
  // PositionRecord; "" for text and tokens data).
  std::string data_position;
  // The newest validation loss at or before this step (eval_step 0: none), which a resumed
  // run carries into its own checkpoints until it validates again.
  int64_t eval_step = 0;
  double eval_loss = 0;
  // A rescue's record of this step's agreed update (Note [Rolled rescue]): what a layer saved
  // at the step before with this step's gradients needs to be brought to this step.
  bool has_update = false;
  bool update_skipped = false;  // the agreement found an overflow: no update was applied
  double update_grad_norm = 0;  // the global gradient norm the update clipped by
  // The generation (the manager's count) whose rescuer wrote this record; 0: not recorded.
  // Pending layers count only beside an update of their own generation.
  int64_t generation = 0;
  // Written for people and tools, not read back:
  int micro_batch = 0;
  std::string stage_to_rank_map;  // the uniform case's stage map ("" otherwise)
};
// A layer's file, relative to the checkpoint directory, in `format`:
// "layers/<layer>.safetensors" (2) or "layers/<layer>.pt" (1).
std::string LayerFileOf(int format, const std::string& layer);
// common.json's text for `c` (its format field included), with `info` added as string fields (the
// worker records the job spec there as model_spec). The one writer of the format; the reader is
// ReadCheckpointCommon.
std::string FormatCheckpointCommon(const CheckpointCommon& c,
                                   const std::map<std::string, std::string>& info);
// Falls back to the first readable rescue record when common.json cannot be read.
absl::StatusOr<CheckpointCommon> ReadCheckpointCommon(const std::string& ckpt_path);

// Returns OK if the checkpoint at `ckpt_path` is complete and undamaged; otherwise a status
// whose message names the first problem (missing marker, missing file, size, checksum, ...).
// Complete means: common.json is valid, every writer it lists has a marker and a manifest,
// every manifest path stays inside the checkpoint and names a regular file of the recorded
// size (and checksum), and every layer in common.json (and, when `expected_layers` is given,
// exactly the model's layers) is covered. With checksums=false only presence and sizes are
// checked (cheap; for retention). Never blocks on a FIFO and never throws. A checkpoint that
// is not complete this way is also complete when its rescue records (WriteRescueRecord) are
// consistent and together cover every layer, counting a layer that only a pending record
// (WritePendingRecord) holds when a rescuer recorded the step's update (Note [Rolled rescue]).
absl::Status VerifyCheckpoint(const std::string& ckpt_path, bool checksums = true,
                              const std::vector<std::string>* expected_layers = nullptr);

// Retention: keeps the newest `keep` complete checkpoints under `dir` and deletes every
// checkpoint older than the oldest one kept. Newer incomplete ones (maybe still being
// written) are left alone; the newest complete one is never deleted. keep <= 0: no-op.
// Returns the deleted steps.
std::vector<int64_t> PruneCheckpoints(const std::string& dir, int keep);

// Steps of all varuna_ckpt_<step> directories under `dir`, newest first.
std::vector<int64_t> ListCheckpointSteps(const std::string& dir);

// Parses a resume point as written by a user (--resume_step, checkpoint.resume): "latest"
// gives nullopt (the newest complete checkpoint), a number >= 1 that step.
absl::StatusOr<std::optional<int64_t>> ParseResumeStep(const std::string& value);

// Resolves a resume request: `requested` is a step or nullopt for "latest". Returns nullopt if
// `dir` holds no checkpoint at all (start fresh), the newest complete step otherwise (each
// skipped one is logged with the reason), or an error if checkpoints exist but none is
// complete, or the requested one is not complete.
// With `expected_layers`, a checkpoint that does not hold exactly these layers is skipped
// (latest) or refused (a requested step).
absl::StatusOr<std::optional<int64_t>> ResolveResumeStep(
    const std::string& dir, std::optional<int64_t> requested,
    const std::vector<std::string>* expected_layers = nullptr);

}  // namespace varuna

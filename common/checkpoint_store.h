#pragma once

// The on-disk checkpoint layout (docs/checkpoints.md), without LibTorch:
//
//   DIR/varuna_ckpt_<step>/            step = optimizer steps completed
//     common.json                      written by rank 0: step, config, scaler, spec, writers
//     layers/<layer name>.pt           one file per layer: parameters, buffers, optimizer state
//     manifest.rank<R>.json            per writer: every file it wrote, size and CRC-32
//     complete.rank<R>                 per writer, written last (after fsync of the rest)
//
// A checkpoint is complete when common.json parses, every writer it lists has its marker and
// manifest, and every file in every manifest has the recorded size and checksum.

#include <cstdint>
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
absl::StatusOr<FileDigest> DigestFile(const std::string& root, const std::string& relative);
FileDigest DigestBytes(const std::string& relative, const std::string& bytes);

// Writes `bytes` to `path` via a temporary name unique to `writer`, fsyncs, renames.
absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes, int writer);
// fsyncs an existing file (e.g. one written by a library) and its directory.
absl::Status SyncFile(const std::string& path);

// Writes the writer's manifest, then its completeness marker (both atomically, fsynced).
absl::Status WriteManifestAndMarker(const std::string& ckpt_path, int writer,
                                    const std::vector<FileDigest>& files);

// Returns OK if the checkpoint at `ckpt_path` is complete and undamaged; otherwise a status
// whose message names the first problem (missing marker, missing file, size, checksum, ...).
// With checksums=false only presence and sizes are checked (cheap; for retention).
absl::Status VerifyCheckpoint(const std::string& ckpt_path, bool checksums = true);

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
absl::StatusOr<std::optional<int64_t>> ResolveResumeStep(const std::string& dir,
                                                         std::optional<int64_t> requested);

}  // namespace varuna

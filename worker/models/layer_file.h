#pragma once

// A checkpoint's layer files (docs/checkpoints.md), one per model layer, each a dict of named
// tensors ("param.<name>", "buffer.<name>", "opt.<name>.<field>"):
//   format 2 (written): layers/<layer>.safetensors, the tensors' raw bytes after a JSON header
//     (common/checkpoint/safetensors.h); loads in Python with safetensors.torch.load_file;
//   format 1 (read only): layers/<layer>.pt, torch::pickle_save of the dict (torch.load).
// The in-place handover still sends the pickled form between ranks (UnpickleLayer).

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint/checkpoint_store.h"

namespace varuna {

using LayerDict = c10::Dict<std::string, at::Tensor>;

// The safetensors dtype name of a LibTorch scalar type, and back; an error names the type.
absl::StatusOr<std::string> SafetensorsDtypeOf(at::ScalarType type);
absl::StatusOr<at::ScalarType> ScalarTypeOf(absl::string_view safetensors_dtype);

// Writes `layer` (CPU tensors, in the dict's order) as `root`/`rel` in format 2, via a
// temporary name unique to `writer`, fsynced and renamed, its directory fsynced. The digest's
// CRC-32 is taken from the bytes as they are written (no read-back).
absl::StatusOr<FileDigest> WriteLayerFile(const std::string& root, const std::string& rel,
                                          const LayerDict& layer, int writer);

// Every layer of `layers` (layer name, its dict) written as WriteLayerFile does, as
// `root`/layers/<name>.safetensors, two files at a time: a file's last piece and its fsyncs
// leave the disk idle, which the other file's writes fill (Note [Writes at disk speed] in
// common/checkpoint/safetensors.cc). The digests in `layers`' order, or the first error.
// With `pending`, to `root`/pending/<name>.safetensors instead (Note [Rolled rescue] in
// common/checkpoint/checkpoint_store.cc).
absl::StatusOr<std::vector<FileDigest>> WriteLayerFiles(
    const std::string& root, const std::vector<std::pair<std::string, LayerDict>>& layers,
    int writer, bool pending = false);

// Reads a layer file of either format (by its name's extension), adding its size to
// `bytes_read` if given. A file that lies about its contents is DataLoss naming the problem.
absl::StatusOr<LayerDict> ReadLayerFile(const std::string& file, int64_t* bytes_read);

// The pickled form (format 1 files; the in-place handover's messages).
absl::StatusOr<LayerDict> UnpickleLayer(const std::vector<char>& bytes, const std::string& what);

}  // namespace varuna

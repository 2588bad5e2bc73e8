#pragma once

// The safetensors format (Hugging Face's weight files), read and written without LibTorch:
//
//   8 bytes        N, the header's length, little-endian u64
//   N bytes        a JSON object: {"__metadata__": {str: str}?, name: {"dtype": "F32",
//                  "shape": [2, 3], "data_offsets": [begin, end]}, ...}, space-padded
//   the rest       the data buffer; offsets are relative to its start, little-endian values
//
// A file is outside data: the reader checks everything the header claims before any tensor is
// read (sizes agree with shapes and dtypes, tensors tile the buffer with no gap, overlap or
// byte past the end) and reads with bounded preads, so a header that lies is an error naming
// the problem, never a crash or an out-of-range read (bench/fuzz.sh safetensors_fuzz).
//
// The writer streams: it takes every tensor's name, dtype and shape first, writes the header,
// then the tensors' bytes one at a time in that order, so memory stays one tensor. It
// computes the file's CRC-32 as the bytes go out and starts the disk's writeback behind them
// (Note [Writes at disk speed] in safetensors.cc).
// Its output is canonical: compact JSON, "__metadata__" first, tensors in the order given, the
// header padded with spaces to a multiple of 8 (the golden file in tests/common/checkpoint is
// made by an independent Python writer with the same rules).

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace varuna {

// The format's dtype names ("F32", "BF16", ...) and their sizes; 0 for an unknown name.
int SafetensorsDtypeBytes(absl::string_view dtype);

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "BF16", "F16", ... (the format's names)
  std::vector<int64_t> shape;  // [] is a scalar
  uint64_t begin = 0;          // absolute offsets in the file (reader), or 0 (writer input)
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
  int64_t numel() const;
};

// The header's limits (the reference implementation refuses headers past 100 MB too).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
inline constexpr int kMaxSafetensorsRank = 16;

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + N
};

// Parses the header text (the N bytes) of a file of `file_size` bytes. Every claim is checked
// against the file's size; DataLoss naming `what` and the problem otherwise.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header,
                                                         uint64_t file_size,
                                                         const std::string& what);

class SafetensorsReader {
 public:
  // Opens a regular file and checks its header; no tensor data is read.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  // The path messages name (one opened through /proc/self/fd is named by what it was).
  void set_path(std::string path) { path_ = std::move(path); }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsEntry* Find(absl::string_view name) const;
  // Reads one tensor's bytes into `out` (which must hold entry.bytes()).
  absl::Status Read(const SafetensorsEntry& entry, void* out) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
};

class SafetensorsWriter {
 public:
  // Creates `path` (via a temporary name unique to this process and `writer`, renamed by
  // Finish) and writes the header for `tensors` (names unique, dtypes known, shapes
  // non-negative; begin/end are ignored).
  static absl::StatusOr<SafetensorsWriter> Create(const std::string& path,
                                                  std::vector<SafetensorsEntry> tensors,
                                                  const std::map<std::string, std::string>& meta,
                                                  int writer = 0);
  SafetensorsWriter(SafetensorsWriter&& o) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& o) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();  // an unfinished file is removed

  // Bytes of the current tensor, in the order given to Create; `name` must be its name. A
  // tensor may come in several parts (a streaming exporter converts it piece by piece); it
  // is complete when its header's byte count has been appended.
  absl::Status Append(absl::string_view name, const void* data, uint64_t bytes);
  // Checks every tensor was written, fsyncs, renames into place.
  absl::Status Finish();
  // The CRC-32 (zlib's) and size of every byte written so far: after Finish(), the file's.
  uint32_t crc32() const { return crc_; }
  uint64_t size() const { return written_; }
  // The header's text for `tensors` (offsets assigned in order), padded; for tests and sizing.
  static std::string HeaderFor(std::vector<SafetensorsEntry>* tensors,
                               const std::map<std::string, std::string>& meta);

 private:
  SafetensorsWriter() = default;
  std::string path_, tmp_;
  int fd_ = -1;
  std::vector<SafetensorsEntry> tensors_;
  size_t next_ = 0;
  uint64_t done_ = 0;  // bytes of tensors_[next_] written so far
  uint64_t written_ = 0;
  uint64_t flushed_ = 0;  // buffered: writeback started up to here
  uint32_t crc_ = 0;
  // Direct I/O (Note [Writes at disk speed]): bytes gather in one of two aligned buffers and
  // go to the disk a full buffer at a time, on a helper thread, while the other fills; null
  // when writing through the page cache.
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, FreeDeleter> stage_;  // two buffers of kPiece bytes
  int current_ = 0;                           // the one filling
  uint64_t staged_ = 0;                       // bytes in it
  uint64_t file_offset_ = 0;                  // where it goes
  std::future<absl::Status> in_flight_;       // the other one's write

  // Checksums and writes (Note [Writes at disk speed]).
  absl::Status Put(const void* data, uint64_t bytes);
  // Writes the filling buffer: a full one directly, on a helper thread, once the other's write
  // is done; at the end (`last`) its aligned part directly and the tail through the page
  // cache, and waits for both.
  absl::Status WriteStage(bool last);
  // The outcome of the write in flight (OK if none).
  absl::Status WaitInFlight();
};

}  // namespace varuna

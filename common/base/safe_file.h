#pragma once

// Reads of files that someone else controls (a job's data, a checkpoint, a worker's progress
// file, a log): the open never blocks (O_NONBLOCK, so a FIFO or a device cannot stall the
// caller), only regular files are read, and every read is bounded. Everything that reads
// outside data goes through here; docs/architecture.md "Hardening".

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace varuna {

// Opens `path` for reading without blocking and checks it is a regular file: its type is
// checked before the open (a device is never opened) and again after (the same inode).
// Returns the fd (O_CLOEXEC, blocking mode restored); the caller closes it. `what` names the
// file in errors, e.g. "data.path". Symbolic links are followed (a data set may be one).
absl::StatusOr<int> OpenRegularFile(const std::string& path, const std::string& what);

// Like OpenRegularFile for `relative` under `root`, but no component below `root` may be a
// symbolic link (the file stays inside `root` on disk, not only as text) and the path must
// pass CheckRelativePathInside. NotFound "missing file ROOT/RELATIVE" if it is not there.
absl::StatusOr<int> OpenRegularFileBeneath(const std::string& root, const std::string& relative,
                                           const std::string& what);

// The whole file, refused (naming `what` and the limit) if it is larger than `max_bytes`.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what);

// Up to `max_bytes` from `offset` (clamped to the file), and the file's size.
struct FileSlice {
  std::string data;
  int64_t offset = 0;
  int64_t size = 0;
};
// A negative `offset` reads from that many bytes before the end.
absl::StatusOr<FileSlice> ReadRegularFileSlice(const std::string& path, int64_t offset,
                                               int64_t max_bytes, const std::string& what);

// A file that a less trusted user wrote, read by a more trusted one (the agent, as root, reading
// a worker's progress file or profile): `name` directly inside `dir` (no link followed, the
// last component included: OpenRegularFileBeneath), a regular file owned by `owner` or by this
// process's user (a hard link to someone else's file is refused too). Nothing of the file's
// content is ever put in an error.
absl::StatusOr<FileSlice> ReadOwnedFileSlice(const std::string& dir, const std::string& name,
                                             uid_t owner, int64_t offset, int64_t max_bytes,
                                             const std::string& what);
absl::StatusOr<std::string> ReadOwnedFile(const std::string& dir, const std::string& name,
                                          uid_t owner, int64_t max_bytes, const std::string& what);

// OK if `path` is a readable regular file (nothing is read).
absl::Status CheckRegularFile(const std::string& path, const std::string& what);

// Appends `text` to `path` (created if missing, mode 0600) unless it exists as something other
// than a regular file; never blocks on a FIFO and never follows a symlink at the last component.
absl::Status AppendToRegularFile(const std::string& path, const std::string& text);

// Removes the directory tree at `path` without ever following a symlink in it, even one that
// another process swaps in for a directory while the removal runs (each directory is opened
// beneath its parent's descriptor with O_NOFOLLOW). A missing `path` is OK; errors name what
// could not be removed.
absl::Status RemoveTreeNoFollow(const std::string& path);

// Rejects relative paths that could leave their root: absolute, empty, "..", NUL bytes.
absl::Status CheckRelativePathInside(const std::string& relative, const std::string& what);

}  // namespace varuna

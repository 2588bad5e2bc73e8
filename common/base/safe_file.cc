#include "common/base/safe_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"

namespace varuna {
namespace {

std::string Errno() { return std::strerror(errno); }

// Reads exactly up to `n` bytes at `offset`; fewer only at end of file.
absl::StatusOr<std::string> ReadAt(int fd, int64_t offset, int64_t n, const std::string& what) {
  std::string out(static_cast<size_t>(n), '\0');
  int64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out.data() + got, static_cast<size_t>(n - got), offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::DataLossError(absl::StrCat(what, ": read failed: ", Errno()));
    if (r == 0) break;
    got += r;
  }
  out.resize(static_cast<size_t>(got));
  return out;
}

// Checks that `fd` is the regular file `before` described, and makes it blocking again
// (reads of a regular file never wait on a writer).
template <typename F>
absl::StatusOr<int> FinishOpen(int fd, const struct stat* before, F not_regular) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != before->st_dev ||
      st.st_ino != before->st_ino) {
    ::close(fd);
    return not_regular();
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(const std::string& path, const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": path contains a NUL byte"));
  }
  auto not_regular = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is not a regular file (a FIFO, device or directory?)"));
  };
  // Type first, so a device's driver is never even opened; then open and check it is still
  // the same regular file (it may have been swapped in between).
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) {
    return absl::NotFoundError(absl::StrCat(what, " '", path, "' cannot be read: ", Errno()));
  }
  if (!S_ISREG(before.st_mode)) return not_regular();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(what, " '", path, "' cannot be read: ", Errno()));
  }
  return FinishOpen(fd, &before, not_regular);
}

absl::StatusOr<int> OpenRegularFileBeneath(const std::string& root, const std::string& relative,
                                           const std::string& what) {
  RETURN_IF_ERROR(CheckRelativePathInside(relative, what));
  auto not_regular = [&] {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", relative,
                                                   "' is not a regular file inside ", root,
                                                   " (a link, FIFO or device?)"));
  };
  int dir = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    return absl::NotFoundError(absl::StrCat(what, ": cannot open ", root, ": ", Errno()));
  }
  std::vector<std::string> parts = absl::StrSplit(relative, '/', absl::SkipEmpty());
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next =
        ::openat(dir, parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    ::close(dir);
    if (next < 0) {
      if (errno == ENOENT) {
        return absl::NotFoundError(absl::StrCat("missing file ", root, "/", relative));
      }
      return not_regular();  // a symlinked or non-directory component
    }
    dir = next;
  }
  struct stat before {};
  if (::fstatat(dir, parts.back().c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0) {
    ::close(dir);
    return absl::NotFoundError(absl::StrCat("missing file ", root, "/", relative));
  }
  if (!S_ISREG(before.st_mode)) {
    ::close(dir);
    return not_regular();
  }
  const int fd = ::openat(dir, parts.back().c_str(),
                          O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  ::close(dir);
  if (fd < 0) return not_regular();
  return FinishOpen(fd, &before, not_regular);
}

namespace {

// Up to `max_bytes` of the open `fd` from `offset`; closes it.
absl::StatusOr<FileSlice> SliceOf(int fd, const struct stat& st, int64_t offset, int64_t max_bytes,
                                  const std::string& what);

}  // namespace

absl::StatusOr<FileSlice> ReadRegularFileSlice(const std::string& path, int64_t offset,
                                               int64_t max_bytes, const std::string& what) {
  auto fd = OpenRegularFile(path, what);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(*fd, &st) != 0) {
    ::close(*fd);
    return absl::DataLossError(absl::StrCat(what, " '", path, "': stat failed"));
  }
  return SliceOf(*fd, st, offset, max_bytes, what);
}

absl::StatusOr<FileSlice> ReadOwnedFileSlice(const std::string& dir, const std::string& name,
                                             uid_t owner, int64_t offset, int64_t max_bytes,
                                             const std::string& what) {
  if (name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name '", name, "' has a '/'"));
  }
  auto fd = OpenRegularFileBeneath(dir, name, what);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(*fd, &st) != 0) {
    ::close(*fd);
    return absl::DataLossError(absl::StrCat(what, " '", dir, "/", name, "': stat failed"));
  }
  if (st.st_uid != owner && st.st_uid != ::geteuid()) {
    ::close(*fd);
    return absl::PermissionDeniedError(
        absl::StrCat(what, " '", dir, "/", name, "' is owned by uid ", st.st_uid,
                     ", not by its writer's uid ", owner, ": not read"));
  }
  return SliceOf(*fd, st, offset, max_bytes, what);
}

absl::StatusOr<std::string> ReadOwnedFile(const std::string& dir, const std::string& name,
                                          uid_t owner, int64_t max_bytes, const std::string& what) {
  auto slice = ReadOwnedFileSlice(dir, name, owner, 0, max_bytes + 1, what);
  if (!slice.ok()) return slice.status();
  if (slice->size > max_bytes || static_cast<int64_t>(slice->data.size()) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", dir, "/", name, "' has ", std::max<int64_t>(slice->size, slice->data.size()),
        " bytes; the limit is ", max_bytes));
  }
  return std::move(slice->data);
}

namespace {

absl::StatusOr<FileSlice> SliceOf(int fd, const struct stat& st, int64_t offset, int64_t max_bytes,
                                  const std::string& what) {
  FileSlice slice;
  slice.size = st.st_size;
  // A negative offset counts from the end (the last -offset bytes).
  if (offset < 0) offset = offset < -slice.size ? 0 : slice.size + offset;
  slice.offset = std::clamp<int64_t>(offset, 0, slice.size);
  const int64_t n =
      std::clamp<int64_t>(slice.size - slice.offset, 0, std::max<int64_t>(max_bytes, 0));
  auto data = ReadAt(fd, slice.offset, n, what);
  ::close(fd);
  if (!data.ok()) return data.status();
  slice.data = *std::move(data);
  return slice;
}

}  // namespace

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what) {
  // One byte past the limit, so a file that grew since fstat is noticed, not truncated.
  auto slice = ReadRegularFileSlice(path, 0, max_bytes + 1, what);
  if (!slice.ok()) return slice.status();
  if (slice->size > max_bytes || static_cast<int64_t>(slice->data.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' has ", std::max<int64_t>(slice->size, slice->data.size()),
                     " bytes; the limit is ", max_bytes));
  }
  return std::move(slice->data);
}

absl::Status CheckRegularFile(const std::string& path, const std::string& what) {
  auto fd = OpenRegularFile(path, what);
  if (!fd.ok()) return fd.status();
  ::close(*fd);
  return absl::OkStatus();
}

absl::Status AppendToRegularFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", Errno()));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  if (done != text.size()) return absl::InternalError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::Status CheckRelativePathInside(const std::string& relative, const std::string& what) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path '", relative, "' ", why));
  };
  if (relative.empty()) return bad("is empty");
  if (relative.size() > 4096) return bad("is too long");
  if (relative.find('\0') != std::string::npos) return bad("contains a NUL byte");
  if (relative.front() == '/') return bad("is absolute");
  for (absl::string_view part : absl::StrSplit(relative, '/')) {
    if (part == "..") return bad("leaves its directory ('..')");
  }
  return absl::OkStatus();
}

namespace {

// Empties the directory open at `dir` (which it closes), depth first.
absl::Status EmptyDirectory(int dir, const std::string& path, int depth) {
  DIR* d = ::fdopendir(dir);
  if (d == nullptr) {
    ::close(dir);
    return absl::InternalError(absl::StrCat("cannot list ", path, ": ", Errno()));
  }
  absl::Status status;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  for (const std::string& name : names) {
    const std::string child = absl::StrCat(path, "/", name);
    if (::unlinkat(::dirfd(d), name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) {
      status.Update(absl::InternalError(absl::StrCat("cannot remove ", child, ": ", Errno())));
      continue;
    }
    // A directory: opened without following a link, so a link swapped in is only unlinked.
    const int sub = ::openat(::dirfd(d), name.c_str(),
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (sub < 0) {
      if (::unlinkat(::dirfd(d), name.c_str(), 0) != 0 && errno != ENOENT) {
        status.Update(absl::InternalError(absl::StrCat("cannot open ", child, ": ", Errno())));
      }
      continue;
    }
    if (depth > 64) {
      ::close(sub);
      status.Update(absl::InternalError(absl::StrCat(child, ": nested too deep")));
      continue;
    }
    status.Update(EmptyDirectory(sub, child, depth + 1));
    if (::unlinkat(::dirfd(d), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      status.Update(absl::InternalError(absl::StrCat("cannot remove ", child, ": ", Errno())));
    }
  }
  ::closedir(d);
  return status;
}

}  // namespace

absl::Status RemoveTreeNoFollow(const std::string& path) {
  const int dir = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", Errno()));
  }
  RETURN_IF_ERROR(EmptyDirectory(dir, path, 0));
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", Errno()));
  }
  return absl::OkStatus();
}

}  // namespace varuna

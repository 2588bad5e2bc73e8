#include "common/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/json_text.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace {

absl::Status Lie(const std::string& what, const std::string& problem) {
  return absl::DataLossError(absl::StrCat(what, ": ", problem));
}

// A JSON integer in [0, 2^63): the text must be all digits (no sign, exponent or fraction).
absl::StatusOr<uint64_t> Count(const YAML::Node& v, const std::string& what,
                               const std::string& key) {
  if (!v.IsScalar()) return Lie(what, absl::StrCat(key, " must be a number"));
  const std::string& s = v.Scalar();
  uint64_t n = 0;
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(s, &n) || n >= (uint64_t{1} << 63)) {
    return Lie(what, absl::StrCat(key, " must be a non-negative integer, got '", Describe(v), "'"));
  }
  return n;
}

// The pieces the writer goes in, direct I/O's alignment (Note [Writes at disk speed]).
constexpr uint64_t kPiece = uint64_t{8} << 20;
constexpr uint64_t kDirectAlign = 4096;
constexpr uint64_t kCrcThreadBytes = uint64_t{4} << 20;  // below this a thread costs more
constexpr uint64_t kSlice = uint64_t{256} << 10;         // a small part: copied, then checksummed

absl::Status WriteAll(int fd, const void* data, uint64_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<uint64_t>(bytes, 1 << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
    }
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// The writers' staging buffers (two pieces each) are kept for the next writer: a fresh one
// costs a page fault per 4 KB on first touch (~8 ms for 16 MB on a VM), which for a
// checkpoint's dozens of layer files was a fifth of the save.
absl::Mutex stage_pool_mu(absl::kConstInit);
std::vector<char*>* stage_pool ABSL_GUARDED_BY(stage_pool_mu) = nullptr;
constexpr size_t kPooledStages = 4;

char* TakeStage() {
  {
    absl::MutexLock l(&stage_pool_mu);
    if (stage_pool != nullptr && !stage_pool->empty()) {
      char* p = stage_pool->back();
      stage_pool->pop_back();
      return p;
    }
  }
  void* p = nullptr;
  return ::posix_memalign(&p, kDirectAlign, 2 * kPiece) == 0 ? static_cast<char*>(p) : nullptr;
}

void GiveStage(char* p) {
  if (p == nullptr) return;
  {
    absl::MutexLock l(&stage_pool_mu);
    if (stage_pool == nullptr) stage_pool = new std::vector<char*>();
    if (stage_pool->size() < kPooledStages) {
      stage_pool->push_back(p);
      return;
    }
  }
  std::free(p);
}

}  // namespace

int SafetensorsDtypeBytes(absl::string_view dtype) {
  static const auto* sizes = new std::map<std::string, int, std::less<>>{
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes->find(dtype);
  return it == sizes->end() ? 0 : it->second;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header,
                                                         uint64_t file_size,
                                                         const std::string& what) {
  const size_t first = header.find_first_not_of(" \t\r\n");
  if (first == absl::string_view::npos || header[first] != '{') {
    return Lie(what, "the header is not a JSON object");
  }
  absl::StatusOr<YAML::Node> parsed = ParseYaml(std::string(header), what + " header");
  if (!parsed.ok()) return Lie(what, std::string(parsed.status().message()));
  const YAML::Node& root = *parsed;
  if (!root.IsMap()) return Lie(what, "the header is not a JSON object");
  SafetensorsHeader out;
  out.data_start = 8 + header.size();
  if (out.data_start > file_size) return Lie(what, "the header runs past the end of the file");
  const uint64_t data_size = file_size - out.data_start;
  // (A name given twice is refused by ForEachEntry.)
  absl::Status st = ForEachEntry(
      root, what, "", [&](const std::string& name, const YAML::Node& v) -> absl::Status {
        if (name == "__metadata__") {
          if (!v.IsMap()) return Lie(what, "__metadata__ must be an object of strings");
          return ForEachEntry(v, what, "__metadata__",
                              [&](const std::string& k, const YAML::Node& s) -> absl::Status {
                                if (!s.IsScalar()) {
                                  return Lie(what,
                                             absl::StrCat("__metadata__.", k, " must be a string"));
                                }
                                out.metadata[k] = s.Scalar();
                                return absl::OkStatus();
                              });
        }
        if (name.empty()) return Lie(what, "a tensor has an empty name");
        if (!v.IsMap()) return Lie(what, absl::StrCat("tensor '", name, "' is not an object"));
        SafetensorsEntry e;
        e.name = name;
        bool has_dtype = false, has_shape = false, has_offsets = false;
        RETURN_IF_ERROR(ForEachEntry(
            v, what, name, [&](const std::string& k, const YAML::Node& f) -> absl::Status {
              const std::string key = absl::StrCat("tensor '", name, "' ", k);
              if (k == "dtype") {
                if (!f.IsScalar() || SafetensorsDtypeBytes(f.Scalar()) == 0) {
                  return Lie(what,
                             absl::StrCat(key, " '", Describe(f), "' is not a safetensors dtype"));
                }
                e.dtype = f.Scalar();
                has_dtype = true;
              } else if (k == "shape") {
                if (!f.IsSequence() || f.size() > static_cast<size_t>(kMaxSafetensorsRank)) {
                  return Lie(what, absl::StrCat(key, " must be a list of at most ",
                                                kMaxSafetensorsRank, " sizes"));
                }
                for (const YAML::Node& d : f) {
                  ASSIGN_OR_RETURN(uint64_t n, Count(d, what, key));
                  e.shape.push_back(static_cast<int64_t>(n));
                }
                has_shape = true;
              } else if (k == "data_offsets") {
                if (!f.IsSequence() || f.size() != 2) {
                  return Lie(what, absl::StrCat(key, " must be [begin, end]"));
                }
                ASSIGN_OR_RETURN(e.begin, Count(f[0], what, key));
                ASSIGN_OR_RETURN(e.end, Count(f[1], what, key));
                has_offsets = true;
              } else {
                return Lie(what,
                           absl::StrCat("tensor '", name, "' has an unknown field '", k, "'"));
              }
              return absl::OkStatus();
            }));
        if (!has_dtype || !has_shape || !has_offsets) {
          return Lie(what, absl::StrCat("tensor '", name, "' lacks ",
                                        !has_dtype   ? "dtype"
                                        : !has_shape ? "shape"
                                                     : "data_offsets"));
        }
        if (e.begin > e.end || e.end > data_size) {
          return Lie(what, absl::StrCat("tensor '", name, "' data_offsets [", e.begin, ", ", e.end,
                                        "] are outside the ", data_size, "-byte data buffer"));
        }
        // numel * itemsize, without overflow, must be the span the offsets give.
        uint64_t bytes = static_cast<uint64_t>(SafetensorsDtypeBytes(e.dtype));
        for (int64_t d : e.shape) {
          if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
            return Lie(what, absl::StrCat("tensor '", name, "' shape is too large"));
          }
        }
        if (bytes != e.end - e.begin) {
          return Lie(what, absl::StrCat("tensor '", name, "' has ", e.end - e.begin,
                                        " bytes of data but its dtype and shape need ", bytes));
        }
        e.begin += out.data_start;
        e.end += out.data_start;
        out.tensors.push_back(std::move(e));
        return absl::OkStatus();
      });
  if (!st.ok()) {
    return st.code() == absl::StatusCode::kDataLoss ? st : Lie(what, std::string(st.message()));
  }
  // The tensors tile the data buffer: no gap, no overlap, nothing after the last.
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t at = out.data_start;
  for (const SafetensorsEntry& e : out.tensors) {
    if (e.begin != at) {
      return Lie(what, absl::StrCat("tensor '", e.name, "' starts at data offset ",
                                    e.begin - out.data_start, " but the previous one ends at ",
                                    at - out.data_start, " (a gap or an overlap)"));
    }
    at = e.end;
  }
  if (at != file_size) {
    return Lie(what, absl::StrCat("the tensors cover ", at - out.data_start, " of the ", data_size,
                                  " data bytes"));
  }
  return out;
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  ASSIGN_OR_RETURN(r.fd_, OpenRegularFile(path, "safetensors file"));
  const off_t size = ::lseek(r.fd_, 0, SEEK_END);
  if (size < 8) return Lie(path, "shorter than the 8-byte header length");
  unsigned char len_bytes[8];
  if (::pread(r.fd_, len_bytes, 8, 0) != 8) return Lie(path, "cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxSafetensorsHeaderBytes) {
    return Lie(path, absl::StrCat("the header claims ", n, " bytes; the limit is ",
                                  kMaxSafetensorsHeaderBytes));
  }
  if (n > static_cast<uint64_t>(size) - 8) {
    return Lie(path, absl::StrCat("the header claims ", n, " bytes but the file has ", size));
  }
  std::string header(n, '\0');
  if (n > 0 && ::pread(r.fd_, header.data(), n, 8) != static_cast<ssize_t>(n)) {
    return Lie(path, "cannot read the header");
  }
  ASSIGN_OR_RETURN(r.header_, ParseSafetensorsHeader(header, static_cast<uint64_t>(size), path));
  for (size_t i = 0; i < r.header_.tensors.size(); ++i) r.index_[r.header_.tensors[i].name] = i;
  return r;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept { *this = std::move(o); }

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    header_ = std::move(o.header_);
    index_ = std::move(o.index_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::Status SafetensorsReader::Read(const SafetensorsEntry& e, void* out) const {
  char* p = static_cast<char*>(out);
  uint64_t off = e.begin;
  while (off < e.end) {
    const ssize_t n = ::pread(fd_, p, std::min<uint64_t>(e.end - off, 1 << 30), off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat(path_, ": cannot read tensor '", e.name, "': ",
                                              n == 0 ? "the file shrank" : std::strerror(errno)));
    }
    p += n;
    off += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

std::string SafetensorsWriter::HeaderFor(std::vector<SafetensorsEntry>* tensors,
                                         const std::map<std::string, std::string>& meta) {
  std::string h = "{";
  if (!meta.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : meta) {
      if (!first) h += ",";
      first = false;
      AppendJsonString(&h, k);
      h += ":";
      AppendJsonString(&h, v);
    }
    h += "}";
  }
  uint64_t at = 0;
  for (SafetensorsEntry& e : *tensors) {
    e.begin = at;
    e.end = at + static_cast<uint64_t>(e.numel()) * SafetensorsDtypeBytes(e.dtype);
    at = e.end;
    if (h.size() > 1) h += ",";
    AppendJsonString(&h, e.name);
    absl::StrAppend(&h, ":{\"dtype\":\"", e.dtype, "\",\"shape\":[");
    for (size_t i = 0; i < e.shape.size(); ++i) absl::StrAppend(&h, i ? "," : "", e.shape[i]);
    absl::StrAppend(&h, "],\"data_offsets\":[", e.begin, ",", e.end, "]}");
  }
  h += "}";
  while ((8 + h.size()) % 8 != 0) h += ' ';
  return h;
}

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsEntry> tensors,
    const std::map<std::string, std::string>& meta, int writer) {
  std::set<absl::string_view> names;
  for (const SafetensorsEntry& e : tensors) {
    if (e.name.empty() || e.name == "__metadata__" || !names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", e.name, "' is empty, reserved or repeated"));
    }
    if (SafetensorsDtypeBytes(e.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": unknown dtype '", e.dtype, "'"));
    }
    for (int64_t d : e.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": negative shape"));
    }
  }
  SafetensorsWriter w;
  w.path_ = path;
  w.tmp_ = absl::StrCat(path, ".tmp.", ::getpid(), ".", writer);
  w.crc_ = static_cast<uint32_t>(::crc32(0L, Z_NULL, 0));
  const std::string header = HeaderFor(&tensors, meta);
  w.tensors_ = std::move(tensors);
  // As WriteFileAtomic: whatever sits at the temporary name (a FIFO, a symlink) is removed and
  // the file created exclusively, never followed, so the write neither blocks nor lands elsewhere.
  ::unlink(w.tmp_.c_str());
  w.fd_ = ::open(w.tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (w.fd_ < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", w.tmp_, ": ", std::strerror(errno)));
  }
  // Direct I/O where the file system takes it (tmpfs, for one, does not).
  char* stage = nullptr;
  const int flags = ::fcntl(w.fd_, F_GETFL);
  if (flags >= 0 && (stage = TakeStage()) != nullptr) {
    w.stage_.reset(stage);
    // A file system may take the flag and refuse the writes: one block tells (the data
    // overwrites it).
    std::memset(stage, 0, kDirectAlign);
    if (::fcntl(w.fd_, F_SETFL, flags | O_DIRECT) != 0 ||
        ::pwrite(w.fd_, stage, kDirectAlign, 0) != static_cast<ssize_t>(kDirectAlign)) {
      w.stage_.reset();
      if (::fcntl(w.fd_, F_SETFL, flags) != 0 || ::ftruncate(w.fd_, 0) != 0) {
        return absl::InternalError(
            absl::StrCat("cannot write ", w.tmp_, ": ", std::strerror(errno)));
      }
    }
  }
  unsigned char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  RETURN_IF_ERROR(w.Put(len, 8));
  RETURN_IF_ERROR(w.Put(header.data(), header.size()));
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept { *this = std::move(o); }

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& o) noexcept {
  if (this != &o) {
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    fd_ = std::exchange(o.fd_, -1);
    tensors_ = std::move(o.tensors_);
    next_ = o.next_;
    done_ = o.done_;
    written_ = o.written_;
    flushed_ = o.flushed_;
    crc_ = o.crc_;
    stage_ = std::move(o.stage_);
    current_ = o.current_;
    staged_ = o.staged_;
    file_offset_ = o.file_offset_;
    in_flight_ = std::move(o.in_flight_);
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() {
  (void)WaitInFlight();  // it writes from our buffer to our fd
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

absl::Status SafetensorsWriter::Append(absl::string_view name, const void* data, uint64_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (next_ >= tensors_.size() || tensors_[next_].name != name) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": tensor '", name, "' written out of order (expected '",
        next_ < tensors_.size() ? tensors_[next_].name : std::string("nothing more"), "')"));
  }
  const uint64_t want = tensors_[next_].bytes();
  if (bytes > want - done_) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor '", name, "' gets ", done_ + bytes, " bytes; its header says ", want));
  }
  RETURN_IF_ERROR(Put(data, bytes));
  done_ += bytes;
  if (done_ == want) {
    ++next_;
    done_ = 0;
  }
  return absl::OkStatus();
}

// Note [Writes at disk speed]: a checkpoint must reach the disk at about the disk's own speed
// (dd with conv=fsync; docs/benchmarks.md (d)). Written the plain way (write() everything,
// then fsync) it is bound by the CPU, not the disk: the kernel copies every byte into the page
// cache (on a VM the costliest part, and wildly variable), the CRC-32 (zlib's, ~3 GB/s) is a
// second pass on the same thread, and the disk idles until the fsync. So:
// - the file is written with direct I/O where the file system takes it (one block written at
//   creation tells): the caller's bytes are copied (a memcpy, ~12 GB/s) into one of two
//   aligned 8 MB buffers, and each full buffer goes to the device by DMA on a helper thread
//   while the other fills. The last partial block goes through the page cache (direct I/O
//   wants whole blocks). Where direct I/O is refused, writes go through the page cache in
//   8 MB pieces, each followed by sync_file_range WRITE (start writeback now, do not wait), so
//   the disk works while the next piece is copied and the final fsync finds little left;
// - the CRC of a large part runs on another helper thread beside the copies and writes (all
//   only read the caller's bytes, so none waits for another); a small part's is taken here.
//   Either way it covers exactly the bytes written, so the manifest's digest needs no
//   read-back.
namespace {

uint32_t Crc32Of(uint32_t crc, const unsigned char* p, uint64_t bytes) {
  while (bytes > 0) {
    const uint64_t n = std::min<uint64_t>(bytes, uint64_t{1} << 30);  // zlib takes a uInt
    crc = static_cast<uint32_t>(::crc32(crc, p, static_cast<uInt>(n)));
    p += n;
    bytes -= n;
  }
  return crc;
}

}  // namespace

void SafetensorsWriter::FreeDeleter::operator()(char* p) const { GiveStage(p); }

absl::Status SafetensorsWriter::WaitInFlight() {
  if (!in_flight_.valid()) return absl::OkStatus();
  return in_flight_.get();
}

absl::Status SafetensorsWriter::WriteStage(bool last) {
  if (staged_ == 0) return WaitInFlight();
  char* buffer = stage_.get() + current_ * kPiece;
  const uint64_t direct = last ? staged_ / kDirectAlign * kDirectAlign : staged_;
  RETURN_IF_ERROR(WaitInFlight());  // the other buffer is free again
  if (direct > 0) {
    in_flight_ = std::async(
        std::launch::async,
        [fd = fd_, buffer, direct, at = file_offset_, tmp = tmp_]() -> absl::Status {
          for (uint64_t done = 0; done < direct;) {
            const ssize_t n = ::pwrite(fd, buffer + done, direct - done, at + done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
              return absl::InternalError(absl::StrCat(
                  "cannot write ", tmp, ": ", n < 0 ? std::strerror(errno) : "no progress"));
            }
            done += static_cast<uint64_t>(n);
          }
          return absl::OkStatus();
        });
  }
  file_offset_ += direct;
  if (last) RETURN_IF_ERROR(WaitInFlight());
  if (direct < staged_) {  // the tail, less than a block: through the page cache
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp_, ": ", std::strerror(errno)));
    }
    const uint64_t tail = staged_ - direct;
    if (::pwrite(fd_, buffer + direct, tail, file_offset_) != static_cast<ssize_t>(tail)) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp_, ": ", std::strerror(errno)));
    }
    file_offset_ += tail;
  }
  current_ ^= 1;
  staged_ = 0;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Put(const void* data, uint64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  // The CRC of a large part runs on a helper thread beside the copies and writes (all of them
  // only read the caller's bytes); a small one here, in slices, right after each is copied.
  uint32_t crc = crc_;
  std::thread helper;
  if (bytes >= kCrcThreadBytes) {
    try {
      helper = std::thread([&crc, p, bytes] { crc = Crc32Of(crc, p, bytes); });
    } catch (const std::system_error&) {  // no thread to be had: do it here
    }
  }
  const bool inline_crc = !helper.joinable();
  absl::Status st;
  for (uint64_t done = 0; done < bytes && st.ok();) {
    if (stage_ != nullptr) {  // direct: into the filling buffer; full ones go out behind
      char* at = stage_.get() + current_ * kPiece + staged_;
      const uint64_t n = std::min({bytes - done, kPiece - staged_, kSlice});
      std::memcpy(at, p + done, n);
      if (inline_crc) crc = Crc32Of(crc, reinterpret_cast<const unsigned char*>(at), n);
      staged_ += n;
      done += n;
      written_ += n;
      if (staged_ == kPiece) st = WriteStage(/*last=*/false);
      continue;
    }
    const uint64_t n = std::min(bytes - done, kPiece);
    if (inline_crc) crc = Crc32Of(crc, p + done, n);
    st = WriteAll(fd_, p + done, n, tmp_);
    if (!st.ok()) break;
    done += n;
    written_ += n;
    if (written_ - flushed_ >= kPiece) {
      // Advisory: where it is unsupported the final fsync does all the work.
      (void)::sync_file_range(fd_, static_cast<off_t>(flushed_),
                              static_cast<off_t>(written_ - flushed_), SYNC_FILE_RANGE_WRITE);
      flushed_ = written_;
    }
  }
  if (helper.joinable()) helper.join();
  crc_ = crc;
  return st;
}

absl::Status SafetensorsWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (next_ != tensors_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", tensors_.size() - next_, " tensors were never written"));
  }
  if (stage_ != nullptr) {
    absl::Status st = WriteStage(/*last=*/true);
    // A file shorter than the block that probed direct I/O at creation ends here.
    if (st.ok() && ::ftruncate(fd_, static_cast<off_t>(written_)) != 0) {
      st = absl::InternalError(absl::StrCat("cannot write ", tmp_, ": ", std::strerror(errno)));
    }
    if (!st.ok()) {
      ::close(fd_);
      fd_ = -1;
      ::unlink(tmp_.c_str());
      return st;
    }
  }
  if (::fsync(fd_) != 0 || ::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_.c_str());
    return absl::InternalError(absl::StrCat("cannot sync ", tmp_, ": ", std::strerror(errno)));
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp_, " to ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace varuna

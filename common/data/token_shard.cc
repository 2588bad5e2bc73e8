#include "common/data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace varuna {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

absl::Status Bad(const std::string& file, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", why));
}

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kIndexHeader = 9 + 8 + 1 + 8 + 8;
constexpr size_t kLlmcHeader = 256 * 4;

}  // namespace

absl::StatusOr<TokenShard::Mapping> TokenShard::Map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Bad(path, "not a regular file");
  }
  Mapping m;
  m.bytes = static_cast<size_t>(st.st_size);
  if (m.bytes > 0) {
    void* p = ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap: ", std::strerror(errno)));
    }
    m.data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

TokenShard::~TokenShard() {
  for (const Mapping* m : {&bin_, &idx_}) {
    if (m->data != nullptr) ::munmap(const_cast<uint8_t*>(m->data), m->bytes);
  }
}

absl::StatusOr<std::unique_ptr<TokenShard>> TokenShard::OpenIndexed(const std::string& prefix) {
  std::unique_ptr<TokenShard> s(new TokenShard());
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  s->name_ = idx;
  ASSIGN_OR_RETURN(s->idx_, Map(idx));
  ASSIGN_OR_RETURN(s->bin_, Map(bin));
  const uint8_t* h = s->idx_.data;
  if (s->idx_.bytes < kIndexHeader || std::memcmp(h, kIndexMagic, 9) != 0) {
    return Bad(idx, "not a Megatron index (no MMIDIDX header)");
  }
  if (const uint64_t version = Load<uint64_t>(h + 9); version != 1) {
    return Bad(idx, absl::StrCat("index version ", version, "; only version 1 is read"));
  }
  switch (h[17]) {  // Megatron's dtype codes
    case 1:
      s->width_ = 1;
      break;  // uint8
    case 2:
      s->width_ = 1, s->is_signed_ = true;
      break;  // int8
    case 3:
      s->width_ = 2, s->is_signed_ = true;
      break;  // int16
    case 4:
      s->width_ = 4, s->is_signed_ = true;
      break;  // int32
    case 5:
      s->width_ = 8, s->is_signed_ = true;
      break;  // int64
    case 8:
      s->width_ = 2;
      break;  // uint16
    default:
      return Bad(idx, absl::StrCat("dtype code ", static_cast<int>(h[17]),
                                   " is not an integer token type"));
  }
  const uint64_t sequences = Load<uint64_t>(h + 18), doc_marks = Load<uint64_t>(h + 26);
  const uint64_t room = s->idx_.bytes - kIndexHeader;
  if (sequences > room / 12 || doc_marks > (room - sequences * 12) / 8 || doc_marks < 1) {
    return Bad(idx, absl::StrCat("the index claims ", sequences, " sequences and ", doc_marks,
                                 " document marks, more than its ", s->idx_.bytes,
                                 " bytes hold (or no document marks)"));
  }
  const uint8_t* lengths = h + kIndexHeader;
  const uint8_t* pointers = lengths + 4 * sequences;
  const uint8_t* docs = pointers + 8 * sequences;
  if (Load<int64_t>(docs) != 0 ||
      Load<int64_t>(docs + 8 * (doc_marks - 1)) != static_cast<int64_t>(sequences)) {
    return Bad(idx, "document marks do not run from 0 to the sequence count");
  }
  for (uint64_t d = 1; d < doc_marks; ++d) {
    if (Load<int64_t>(docs + 8 * d) < Load<int64_t>(docs + 8 * (d - 1))) {
      return Bad(idx, absl::StrCat("document mark ", d, " goes backwards"));
    }
  }
  s->documents_ = static_cast<int64_t>(doc_marks) - 1;
  bool contiguous = true;
  int64_t total = 0, expect = sequences > 0 ? Load<int64_t>(pointers) : 0;
  for (uint64_t i = 0; i < sequences; ++i) {
    const int64_t len = Load<int32_t>(lengths + 4 * i);
    const int64_t ptr = Load<int64_t>(pointers + 8 * i);
    if (len < 0 || ptr < 0 || static_cast<uint64_t>(ptr) > s->bin_.bytes ||
        static_cast<uint64_t>(len) * s->width_ > s->bin_.bytes - static_cast<uint64_t>(ptr)) {
      return Bad(idx, absl::StrCat("sequence ", i, " (", len, " tokens at byte ", ptr,
                                   ") lies outside ", bin, " (", s->bin_.bytes, " bytes)"));
    }
    contiguous = contiguous && ptr == expect;
    expect = ptr + len * s->width_;
    total += len;
  }
  s->tokens_ = total;
  s->data_offset_ = sequences > 0 ? Load<int64_t>(pointers) : 0;
  if (!contiguous) {
    int64_t start = 0;
    for (uint64_t i = 0; i < sequences; ++i) {
      const int64_t len = Load<int32_t>(lengths + 4 * i);
      if (len == 0) continue;
      s->run_start_.push_back(start);
      s->run_offset_.push_back(Load<int64_t>(pointers + 8 * i));
      start += len;
    }
  }
  s->name_ = bin;
  return s;
}

absl::StatusOr<std::unique_ptr<TokenShard>> TokenShard::OpenLlmc(const std::string& path) {
  std::unique_ptr<TokenShard> s(new TokenShard());
  s->name_ = path;
  ASSIGN_OR_RETURN(s->bin_, Map(path));
  if (s->bin_.bytes < kLlmcHeader) return Bad(path, "shorter than llm.c's 1024-byte header");
  const int32_t magic = Load<int32_t>(s->bin_.data), version = Load<int32_t>(s->bin_.data + 4);
  if (magic == 20240520 && version == 1) {
    s->width_ = 2;
  } else if (magic == 20240801 && version == 7) {
    s->width_ = 4;
  } else {
    return Bad(path, absl::StrCat("llm.c header ", magic, " version ", version,
                                  "; known: 20240520 v1 (uint16), 20240801 v7 (uint32)"));
  }
  const int64_t count = static_cast<uint32_t>(Load<int32_t>(s->bin_.data + 8));
  if (kLlmcHeader + static_cast<uint64_t>(count) * s->width_ != s->bin_.bytes) {
    return Bad(path, absl::StrCat("the header says ", count, " tokens of ", s->width_,
                                  " bytes, but the file has ", s->bin_.bytes - kLlmcHeader,
                                  " bytes after it"));
  }
  s->tokens_ = count;
  s->data_offset_ = kLlmcHeader;
  return s;
}

int64_t TokenShard::TokenAt(const uint8_t* p) const {
  switch (width_) {
    case 1:
      return is_signed_ ? Load<int8_t>(p) : Load<uint8_t>(p);
    case 2:
      return is_signed_ ? Load<int16_t>(p) : Load<uint16_t>(p);
    case 4:
      return is_signed_ ? Load<int32_t>(p) : Load<uint32_t>(p);
    default:
      return Load<int64_t>(p);
  }
}

void TokenShard::Read(int64_t first, int64_t count, int64_t* out) const {
  if (run_start_.empty()) {
    const uint8_t* p = bin_.data + data_offset_ + first * width_;
    for (int64_t i = 0; i < count; ++i) out[i] = TokenAt(p + i * width_);
    return;
  }
  size_t r = std::upper_bound(run_start_.begin(), run_start_.end(), first) - run_start_.begin() - 1;
  while (count > 0) {
    const int64_t run_end = r + 1 < run_start_.size() ? run_start_[r + 1] : tokens_;
    const int64_t n = std::min(count, run_end - first);
    const uint8_t* p = bin_.data + run_offset_[r] + (first - run_start_[r]) * width_;
    for (int64_t i = 0; i < n; ++i) *out++ = TokenAt(p + i * width_);
    first += n;
    count -= n;
    ++r;
  }
}

}  // namespace varuna

#include "worker/engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/safe_file.h"

namespace varuna {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<TokenDataset> TokenDataset::Open(const DataSpec& spec, int seq_len, int vocab,
                                                uint64_t seed) {
  TokenDataset ds;
  ds.width_ = spec.kind == "text" ? 1 : (spec.dtype == "uint32" ? 4 : 2);
  ds.seq_len_ = seq_len;
  ds.seed_ = seed;
  auto opened = OpenRegularFile(spec.path, "data.path");  // never blocks on a FIFO
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("data.path '", spec.path, "' is not a file"));
  }
  ds.bytes_ = static_cast<size_t>(st.st_size);
  if (ds.bytes_ % ds.width_ != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("data.path '", spec.path, "' has ", ds.bytes_,
                                                   " bytes, not a multiple of ", spec.dtype,
                                                   " tokens"));
  }
  ds.num_tokens_ = static_cast<int64_t>(ds.bytes_ / ds.width_);
  if (ds.num_tokens_ < seq_len + 1) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("data.path '", spec.path, "' has ", ds.num_tokens_,
                     " tokens; model.seq_len=", seq_len, " needs at least ", seq_len + 1));
  }
  void* p = ::mmap(nullptr, ds.bytes_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mmap of '", spec.path, "' failed: ", std::strerror(errno)));
  }
  ds.data_ = static_cast<const uint8_t*>(p);
  if (spec.kind == "tokens") {
    // One vectorised pass over the mapped file (the pages are needed for training anyway).
    auto view = torch::from_blob(const_cast<uint8_t*>(ds.data_), {ds.num_tokens_},
                                 ds.width_ == 2 ? torch::kInt16 : torch::kInt32);
    // Reinterpreting unsigned ids as signed: mask back to the unsigned range.
    const uint64_t max_token = static_cast<uint64_t>(
        view.to(torch::kLong)
            .bitwise_and(ds.width_ == 2 ? int64_t{0xFFFF} : int64_t{0xFFFFFFFF})
            .max()
            .item<int64_t>());
    if (max_token >= static_cast<uint64_t>(vocab)) {
      return absl::InvalidArgumentError(absl::StrCat("data.path '", spec.path, "' holds token id ",
                                                     max_token, " but model.vocab is ", vocab));
    }
  }
  return ds;
}

TokenDataset::TokenDataset(TokenDataset&& o) noexcept
    : data_(o.data_),
      bytes_(o.bytes_),
      width_(o.width_),
      num_tokens_(o.num_tokens_),
      seq_len_(o.seq_len_),
      seed_(o.seed_) {
  o.data_ = nullptr;
}

TokenDataset::~TokenDataset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), bytes_);
}

uint64_t TokenDataset::Token(int64_t i) const {
  const uint8_t* p = data_ + i * width_;
  switch (width_) {
    case 1:
      return *p;
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    default: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
  }
}

TensorMap TokenDataset::Batch(int64_t first, int64_t count) const {
  auto ids = torch::empty({count, seq_len_}, torch::kLong);
  auto labels = torch::empty({count, seq_len_}, torch::kLong);
  auto a = ids.accessor<int64_t, 2>();
  auto b = labels.accessor<int64_t, 2>();
  const uint64_t windows = static_cast<uint64_t>(num_tokens_ - seq_len_);
  for (int64_t s = 0; s < count; ++s) {
    const uint64_t index = static_cast<uint64_t>(first + s);
    const int64_t off =
        static_cast<int64_t>(SplitMix64(seed_ * 0x100000001b3ULL ^ index) % windows);
    for (int t = 0; t < seq_len_; ++t) {
      a[s][t] = static_cast<int64_t>(Token(off + t));
      b[s][t] = static_cast<int64_t>(Token(off + t + 1));
    }
  }
  return {{"input_ids", ids}, {"labels", labels}};
}

}  // namespace varuna

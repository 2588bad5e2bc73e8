#include "worker/engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

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
  if (spec.corpus()) {
    CorpusOptions o;
    o.kind = spec.kind;
    for (const DataSource& s : spec.sources) o.sources.push_back({s.shards, s.weight});
    o.seq_len = seq_len;
    o.vocab = vocab;
    o.seed = seed;
    ASSIGN_OR_RETURN(ds.corpus_, Corpus::Open(o));
    ds.seq_len_ = seq_len;
    ds.seed_ = seed;
    ds.positions_ = std::make_unique<Positions>();
    ds.positions_->known.emplace(0, ds.corpus_->Start());
    for (int i = 0; i < ds.corpus_->num_sources(); ++i) ds.num_tokens_ += ds.corpus_->tokens(i);
    return ds;
  }
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
      seed_(o.seed_),
      corpus_(std::move(o.corpus_)),
      positions_(std::move(o.positions_)) {
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

StreamPosition TokenDataset::PositionAt(int64_t samples) const {
  std::lock_guard<std::mutex> lock(positions_->mu);
  auto& known = positions_->known;
  auto it = std::prev(known.upper_bound(samples));  // the start (0) is always known
  StreamPosition pos = it->second;
  corpus_->Advance(&pos, samples - it->first);
  known.emplace(samples, pos);
  while (known.size() > 64) known.erase(std::next(known.begin()));  // keep the start
  return pos;
}

std::vector<SampleRef> TokenDataset::Refs(int64_t first, int64_t count) const {
  StreamPosition pos = PositionAt(first);
  return corpus_->Next(&pos, count);
}

std::string TokenDataset::PositionRecord(int64_t samples) const {
  if (!corpus_) return "";
  const StreamPosition pos = PositionAt(samples);
  return absl::StrCat("{\"samples\": ", samples, ", \"taken\": [", absl::StrJoin(pos.taken, ", "),
                      "], \"corpus\": \"", corpus_->Fingerprint(), "\"}");
}

absl::Status TokenDataset::ResumeFrom(const std::string& record) const {
  if (!corpus_ || record.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(record, "checkpoint data_position"));
  int64_t samples = -1;
  std::string fingerprint;
  StreamPosition pos;
  RETURN_IF_ERROR(ForEachEntry(root, "checkpoint data_position", "",
                               [&](const std::string& key, const YAML::Node& v) -> absl::Status {
                                 if (key == "samples")
                                   return ReadInto(v, "data_position", key, &samples);
                                 if (key == "corpus")
                                   return ReadInto(v, "data_position", key, &fingerprint);
                                 if (key == "taken")
                                   return ReadInto(v, "data_position", key, &pos.taken);
                                 return absl::OkStatus();
                               }));
  if (fingerprint != corpus_->Fingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint was trained on another corpus (fingerprint ", fingerprint,
                     ", this job's ", corpus_->Fingerprint(),
                     "): its sources, weights or shards changed, so where its stream "
                     "stands means nothing here; resume with the same data, or start afresh"));
  }
  const bool negative =
      std::any_of(pos.taken.begin(), pos.taken.end(), [](int64_t t) { return t < 0; });
  if (samples < 0 || negative || static_cast<int>(pos.taken.size()) != corpus_->num_sources() ||
      pos.total() != samples) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint data_position '", record, "' does not add up"));
  }
  std::lock_guard<std::mutex> lock(positions_->mu);
  positions_->known[samples] = std::move(pos);
  return absl::OkStatus();
}

absl::StatusOr<TensorMap> TokenDataset::Batch(int64_t first, int64_t count) const {
  auto ids = torch::empty({count, seq_len_}, torch::kLong);
  auto labels = torch::empty({count, seq_len_}, torch::kLong);
  auto a = ids.accessor<int64_t, 2>();
  auto b = labels.accessor<int64_t, 2>();
  if (corpus_) {
    // Evaluation (worker_run.cc asks for samples from 2^40 on) reads the stream's first
    // samples; a held-out split is not there yet.
    constexpr int64_t kFarAway = int64_t{1} << 40;
    const std::vector<SampleRef> refs = Refs(first >= kFarAway ? first - kFarAway : first, count);
    std::vector<int64_t> tokens(seq_len_ + 1);
    for (int64_t s = 0; s < count; ++s) {
      RETURN_IF_ERROR(corpus_->Tokens(refs[s], tokens.data()));
      for (int t = 0; t < seq_len_; ++t) {
        a[s][t] = tokens[t];
        b[s][t] = tokens[t + 1];
      }
    }
    return TensorMap{{"input_ids", ids}, {"labels", labels}};
  }
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
  return TensorMap{{"input_ids", ids}, {"labels", labels}};
}

}  // namespace varuna

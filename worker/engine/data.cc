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
#include "common/base/splitmix.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace {

// Note [Masking]: BERT's masked language modelling, decided by the sample alone. A sample's
// key is its identity: for a corpus (source, epoch, sample) of the stream, for text and tokens
// its global index; with the seed it starts a SplitMix64 sequence, two draws per position:
// the first picks 15% of the positions to predict, the second replaces a picked token by
// [MASK] (80%), a uniformly random token (10%, a third draw) or leaves it (10%). So every
// shape, replica, resume and morph masks a sample alike, and the count of predicted positions
// of any batch is known before its forward (the step's loss is their mean: Note
// [Masked-token weighting] in pipeline_executor.cc).
class MaskDraws {
 public:
  explicit MaskDraws(uint64_t key) : state_(key) {}
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return SplitMix64(state_);
  }

 private:
  uint64_t state_;
};
constexpr double kMaskRate = 0.15;

// Draws the masking of the sample with `key` over `n` positions; with `ids` and `labels` it
// applies it (labels: the original token where predicted, else -100). Returns how many
// positions are predicted.
int64_t DrawMask(uint64_t key, int n, int64_t mask_token, int vocab, int64_t* ids,
                 int64_t* labels) {
  MaskDraws draws(key);
  int64_t picked = 0;
  for (int t = 0; t < n; ++t) {
    const bool predict = draws.Uniform() < kMaskRate;
    if (labels != nullptr) labels[t] = predict ? ids[t] : -100;
    if (!predict) continue;
    ++picked;
    const double how = draws.Uniform();
    if (how < 0.8) {
      if (ids != nullptr) ids[t] = mask_token;
    } else if (how < 0.9) {
      const int64_t random = static_cast<int64_t>(draws.Next() % static_cast<uint64_t>(vocab));
      if (ids != nullptr) ids[t] = random;
    }
  }
  return picked;
}

}  // namespace

uint64_t TokenDataset::MaskKey(int64_t index, const SampleRef* ref) const {
  uint64_t k = SplitMix64(seed_ ^ 0x6d61736b6c6d0000ULL);  // "masklm"
  if (ref == nullptr) return SplitMix64(k ^ static_cast<uint64_t>(index));
  k = SplitMix64(k ^ static_cast<uint64_t>(ref->source));
  k = SplitMix64(k ^ static_cast<uint64_t>(ref->epoch));
  return SplitMix64(k ^ static_cast<uint64_t>(ref->sample));
}

int64_t TokenDataset::LossTokens(int64_t first, int64_t count) const {
  if (!masked_lm()) return count * seq_len_;
  const std::vector<SampleRef> refs = corpus_ ? Refs(first, count) : std::vector<SampleRef>();
  int64_t total = 0;
  for (int64_t s = 0; s < count; ++s) {
    total += DrawMask(MaskKey(first + s, corpus_ ? &refs[s] : nullptr), seq_len_, mask_token_,
                      vocab_, nullptr, nullptr);
  }
  return total;
}

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
  int64_t* a = ids.data_ptr<int64_t>();
  int64_t* b = labels.data_ptr<int64_t>();
  // Evaluation without an eval section (worker_run.cc asks for samples from 2^40 on) reads a
  // corpus's first samples.
  constexpr int64_t kFarAway = int64_t{1} << 40;
  const std::vector<SampleRef> refs =
      corpus_ ? Refs(first >= kFarAway ? first - kFarAway : first, count)
              : std::vector<SampleRef>();
  const uint64_t windows = static_cast<uint64_t>(num_tokens_ - seq_len_);
  std::vector<int64_t> tokens(seq_len_ + 1);
  for (int64_t s = 0; s < count; ++s) {
    if (corpus_) {
      RETURN_IF_ERROR(corpus_->Tokens(refs[s], tokens.data()));
    } else {
      const uint64_t index = static_cast<uint64_t>(first + s);
      const int64_t off =
          static_cast<int64_t>(SplitMix64(seed_ * 0x100000001b3ULL ^ index) % windows);
      for (int t = 0; t <= seq_len_; ++t) tokens[t] = static_cast<int64_t>(Token(off + t));
    }
    int64_t* row_ids = a + s * seq_len_;
    int64_t* row_labels = b + s * seq_len_;
    if (masked_lm()) {
      std::copy(tokens.begin(), tokens.begin() + seq_len_, row_ids);
      DrawMask(MaskKey(first + s, corpus_ ? &refs[s] : nullptr), seq_len_, mask_token_, vocab_,
               row_ids, row_labels);
    } else {  // the next token of each position
      std::copy(tokens.begin(), tokens.begin() + seq_len_, row_ids);
      std::copy(tokens.begin() + 1, tokens.end(), row_labels);
    }
  }
  TensorMap out{{"input_ids", ids}, {"labels", labels}};
  if (masked_lm()) out["loss_tokens"] = (labels != -100).sum(1);
  return out;
}

}  // namespace varuna

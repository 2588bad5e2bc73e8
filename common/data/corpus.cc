#include "common/data/corpus.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/sha256.h"
#include "common/base/splitmix.h"
#include "common/base/status_macros.h"

namespace varuna {
namespace {

// The key of (seed, source, epoch)'s order.
uint64_t EpochKey(uint64_t seed, int source, int64_t epoch) {
  return SplitMix64(SplitMix64(seed ^ 0x5eed5eedULL) ^
                    SplitMix64(static_cast<uint64_t>(source) + 1) ^
                    SplitMix64(static_cast<uint64_t>(epoch) * 0x2545f4914f6cdd1dULL));
}

}  // namespace

int64_t PermutedIndex(uint64_t key, int64_t n, int64_t index) {
  if (n <= 1) return 0;
  int half = 1;  // bits per half: 4^half >= n
  while ((int64_t{1} << (2 * half)) < n) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(index);
  do {  // cycle walking: the permutation of [0, 4^half) restricted to [0, n)
    uint64_t left = x >> half, right = x & mask;
    for (int round = 0; round < 4; ++round) {
      const uint64_t f =
          SplitMix64(key ^ SplitMix64(right + (static_cast<uint64_t>(round) << 56))) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

int64_t StreamPosition::total() const {
  int64_t t = 0;
  for (int64_t n : taken) t += n;
  return t;
}

absl::StatusOr<std::unique_ptr<Corpus>> Corpus::Open(const CorpusOptions& options) {
  if (options.kind != "indexed" && options.kind != "llmc") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.kind '", options.kind, "': a corpus is indexed or llmc"));
  }
  if (options.sources.empty()) return absl::InvalidArgumentError("data.sources is empty");
  if (options.seq_len < 1 || options.vocab < 1) {
    return absl::InvalidArgumentError("a corpus needs seq_len >= 1 and vocab >= 1");
  }
  std::unique_ptr<Corpus> c(new Corpus(options));
  double sum = 0;
  for (size_t i = 0; i < options.sources.size(); ++i) {
    const CorpusSource& src = options.sources[i];
    const std::string where = absl::StrCat("data.sources[", i, "]");
    if (!std::isfinite(src.weight) || src.weight < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".weight is ", src.weight, "; weights are finite and >= 0"));
    }
    if (src.shards.empty())
      return absl::InvalidArgumentError(absl::StrCat(where, " has no shards"));
    Source s;
    s.weight = src.weight;
    for (const std::string& path : src.shards) {
      s.names.push_back(std::filesystem::path(path).filename().string());
      ASSIGN_OR_RETURN(std::unique_ptr<TokenShard> shard, options.kind == "indexed"
                                                              ? TokenShard::OpenIndexed(path)
                                                              : TokenShard::OpenLlmc(path));
      s.shard_start.push_back(s.tokens);
      s.tokens += shard->tokens();
      s.shards.push_back(std::move(shard));
    }
    s.samples = (s.tokens - 1) / options.seq_len;
    if (s.samples < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (", src.shards.front(), (src.shards.size() > 1 ? ", ..." : ""), ") has ",
          s.tokens, " tokens: fewer than one sample of seq_len + 1 = ", options.seq_len + 1));
    }
    sum += s.weight;
    c->sources_.push_back(std::move(s));
  }
  if (!(sum > 0)) {
    return absl::InvalidArgumentError("data.sources: the weights sum to zero");
  }
  for (Source& s : c->sources_) s.weight /= sum;
  return c;
}

std::string Corpus::Fingerprint() const {
  Sha256 h;
  h.Update(absl::StrCat(options_.kind, ";", options_.seq_len, ";", options_.seed));
  for (const Source& s : sources_) {
    h.Update(absl::StrCat(";", absl::StrFormat("%.17g", s.weight), ":", s.tokens, ":",
                          absl::StrJoin(s.names, ",")));
  }
  return h.HexDigest().substr(0, 16);
}

int64_t Corpus::samples(int source) const { return sources_[source].samples; }
int64_t Corpus::tokens(int source) const { return sources_[source].tokens; }

StreamPosition Corpus::Start() const {
  StreamPosition p;
  p.taken.assign(sources_.size(), 0);
  return p;
}

int Corpus::NextSource(const StreamPosition& pos) const {
  const double n = std::max<double>(static_cast<double>(pos.total()), 1.0);
  int best = -1;
  double best_error = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (sources_[i].weight <= 0) continue;  // never read
    const double error = sources_[i].weight * n - static_cast<double>(pos.taken[i]);
    if (error > best_error) {
      best_error = error;
      best = static_cast<int>(i);
    }
  }
  return best;
}

std::vector<SampleRef> Corpus::Next(StreamPosition* pos, int64_t count) const {
  std::vector<SampleRef> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(0, count)));
  for (int64_t k = 0; k < count; ++k) {
    const int i = NextSource(*pos);
    const Source& s = sources_[i];
    const int64_t taken = pos->taken[i]++;
    SampleRef r;
    r.source = i;
    r.epoch = taken / s.samples;
    r.sample = PermutedIndex(EpochKey(options_.seed, i, r.epoch), s.samples, taken % s.samples);
    out.push_back(r);
  }
  return out;
}

void Corpus::Advance(StreamPosition* pos, int64_t count) const {
  for (int64_t k = 0; k < count; ++k) ++pos->taken[NextSource(*pos)];
}

StreamPosition Corpus::PositionAt(int64_t samples) const {
  StreamPosition p = Start();
  Advance(&p, samples);
  return p;
}

absl::Status Corpus::Tokens(const SampleRef& ref, int64_t* out) const {
  const Source& s = sources_[ref.source];
  int64_t first = ref.sample * options_.seq_len;
  int64_t left = options_.seq_len + 1;
  size_t shard = std::upper_bound(s.shard_start.begin(), s.shard_start.end(), first) -
                 s.shard_start.begin() - 1;
  int64_t* at = out;
  while (left > 0) {
    const TokenShard& f = *s.shards[shard];
    const int64_t in_shard = first - s.shard_start[shard];
    const int64_t n = std::min(left, f.tokens() - in_shard);
    f.Read(in_shard, n, at);
    for (int64_t j = 0; j < n; ++j) {
      if (at[j] < 0 || at[j] >= options_.vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.name(), ": token ", at[j], " at position ", in_shard + j,
                         " is outside the model's vocabulary (", options_.vocab, ")"));
      }
    }
    at += n;
    first += n;
    left -= n;
    ++shard;
  }
  return absl::OkStatus();
}

}  // namespace varuna

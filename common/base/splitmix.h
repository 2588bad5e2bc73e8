#pragma once

// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014): the output of its sequence at state x, a 64-bit mixing function. The sample
// stream's shuffles (common/data/corpus.cc) and the worker's windows and
// masks (worker/engine/data.cc) draw from it, so a seed means the same on every rank.

#include <cstdint>

namespace varuna {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace varuna

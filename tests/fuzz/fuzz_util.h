#pragma once

// Helpers shared by the fuzz targets (docs/fuzzing.md): split one input into parts and
// keep a scratch directory per process.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace varuna::fuzz {

// Splits `data` at "\n--8<--\n" separators into at most `max_parts` parts.
std::vector<std::string> Split(const uint8_t* data, size_t size, size_t max_parts);

// A directory private to this process, made once, under $TMPDIR.
const std::string& ScratchDir();

// Only FATAL log lines from glog (the targets call this from LLVMFuzzerInitialize).
void QuietLogging();

// Writes `bytes` to `path` (replacing what was there).
void WriteFile(const std::string& path, const std::string& bytes);

}  // namespace varuna::fuzz

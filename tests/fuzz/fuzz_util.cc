#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "glog/logging.h"

namespace varuna::fuzz {

std::vector<std::string> Split(const uint8_t* data, size_t size, size_t max_parts) {
  static const std::string kSep = "\n--8<--\n";
  const std::string all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  while (parts.size() + 1 < max_parts) {
    const size_t at = all.find(kSep, start);
    if (at == std::string::npos) break;
    parts.push_back(all.substr(start, at - start));
    start = at + kSep.size();
  }
  parts.push_back(all.substr(start));
  while (parts.size() < max_parts) parts.emplace_back();
  return parts;
}

const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/varuna-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void QuietLogging() { FLAGS_minloglevel = 3; }

void WriteFile(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace varuna::fuzz

#include "common/base/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace varuna {
namespace {

// Note [Event files]: what TensorBoard reads. A file named events.out.tfevents.* holds TFRecords:
//   uint64 length, uint32 masked CRC-32C of those 8 bytes, the payload, uint32 masked CRC of it,
// all little-endian; each payload is a tensorflow.Event:
//   Event        { double wall_time = 1; int64 step = 2; string file_version = 3;
//                  Summary summary = 5; SessionLog session_log = 7; }
//   SessionLog   { enum status = 1 (START = 1); }
//   Summary      { repeated Value value = 1; }
//   Value        { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//                  SummaryMetadata metadata = 9; }
//   SummaryMetadata { PluginData plugin_data = 1 { string plugin_name = 1; } }
//   TensorProto  { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2;
//                  repeated bytes string_val = 8; }
// The first event carries file_version "brain.Event:2". A SessionLog START at step s tells
// TensorBoard's reader (EventAccumulator, purge_orphaned_data) to drop the events of earlier
// files at steps >= s: a run that resumes or regroups redoes them, so each tag's steps stay
// increasing. Files are read in name order, so names start with the creation time.

constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

// Protocol-buffer wire format, the few shapes an Event needs.
void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void Key(int field, int wire_type, std::string* out) {
  Varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type), out);
}
void Bytes(int field, absl::string_view v, std::string* out) {
  Key(field, 2, out);
  Varint(v.size(), out);
  out->append(v.data(), v.size());
}
void VarintField(int field, uint64_t v, std::string* out) {
  Key(field, 0, out);
  Varint(v, out);
}
template <typename T>
void Fixed(int field, T v, std::string* out) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  Key(field, sizeof(T) == 4 ? 5 : 1, out);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out->append(b, sizeof(T));
}
void LittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event at `step` now, with `body` (its other fields, encoded) appended.
std::string Event(int64_t step, const std::string& body) {
  std::string e;
  Fixed(1, UnixSeconds(), &e);
  VarintField(2, static_cast<uint64_t>(step), &e);
  e += body;
  return e;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& dir,
                                                                           int64_t first_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensorboard_dir '", dir, "' cannot be created: ", ec.message()));
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(now).count();
  const std::string path =
      absl::StrFormat("%s/events.out.tfevents.%010d.%06d.%s.%d", dir, us / 1000000, us % 1000000,
                      host, static_cast<int>(getpid()));
  FILE* f = std::fopen(path.c_str(), "wbx");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensorboard_dir: cannot create '", path, "': ", std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(path, f));
  std::string version;
  Bytes(3, "brain.Event:2", &version);
  RETURN_IF_ERROR(w->WriteEvent(Event(first_step, version)));
  RETURN_IF_ERROR(w->SessionStart(first_step));
  RETURN_IF_ERROR(w->Flush());
  return w;
}

absl::Status TensorBoardWriter::SessionStart(int64_t step) {
  std::string start, session;
  VarintField(1, 1, &session);  // SessionLog.START
  Bytes(7, session, &start);
  return WriteEvent(Event(step, start));
}

TensorBoardWriter::~TensorBoardWriter() { std::fclose(file_); }

absl::Status TensorBoardWriter::Scalar(absl::string_view tag, int64_t step, double value) {
  std::string v, summary, body;
  Bytes(1, tag, &v);
  Fixed(2, static_cast<float>(value), &v);
  Bytes(1, v, &summary);
  Bytes(5, summary, &body);
  return WriteEvent(Event(step, body));
}

absl::Status TensorBoardWriter::Text(absl::string_view tag, int64_t step, absl::string_view text) {
  std::string plugin, metadata, tensor, v, summary, body;
  Bytes(1, "text", &plugin);
  Bytes(1, plugin, &metadata);
  VarintField(1, 7, &tensor);  // DT_STRING
  Bytes(2, "", &tensor);       // a scalar: a shape with no dimensions
  Bytes(8, text, &tensor);
  Bytes(1, tag, &v);
  Bytes(8, tensor, &v);
  Bytes(9, metadata, &v);
  Bytes(1, v, &summary);
  Bytes(5, summary, &body);
  return WriteEvent(Event(step, body));
}

absl::Status TensorBoardWriter::WriteEvent(const std::string& event) {
  std::string record, len;
  LittleEndian(event.size(), 8, &len);
  record += len;
  LittleEndian(MaskedCrc32c(len), 4, &record);
  record += event;
  LittleEndian(MaskedCrc32c(event), 4, &record);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::Flush() {
  if (std::fflush(file_) != 0) {
    return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace varuna

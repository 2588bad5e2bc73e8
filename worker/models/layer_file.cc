#include "worker/models/layer_file.h"

#include <torch/serialize.h>

#include <atomic>
#include <map>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/safetensors.h"
#include "worker/dist/torch_status.h"

namespace varuna {
namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& DtypeNames() {
  static const auto* names = new std::vector<std::pair<at::ScalarType, const char*>>{
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},   {at::kBool, "BOOL"}};
  return *names;
}

}  // namespace

absl::StatusOr<std::string> SafetensorsDtypeOf(at::ScalarType type) {
  for (const auto& [t, name] : DtypeNames()) {
    if (t == type) return std::string(name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no checkpoint dtype for tensors of type ", c10::toString(type)));
}

absl::StatusOr<at::ScalarType> ScalarTypeOf(absl::string_view dtype) {
  for (const auto& [t, name] : DtypeNames()) {
    if (dtype == name) return t;
  }
  return absl::DataLossError(absl::StrCat("dtype '", dtype, "' is not one a checkpoint holds"));
}

absl::StatusOr<FileDigest> WriteLayerFile(const std::string& root, const std::string& rel,
                                          const LayerDict& layer, int writer) {
  const std::string path = absl::StrCat(root, "/", rel);
  std::vector<SafetensorsEntry> entries;
  std::vector<at::Tensor> bytes;  // contiguous CPU tensors, in the entries' order
  entries.reserve(layer.size());
  bytes.reserve(layer.size());
  for (const auto& e : layer) {
    const at::Tensor& t = e.value();
    if (!t.device().is_cpu()) {
      return absl::InternalError(
          absl::StrCat(path, ": '", e.key(), "' is on ", t.device().str(), ", not the host"));
    }
    SafetensorsEntry entry;
    entry.name = e.key();
    ASSIGN_OR_RETURN(entry.dtype, SafetensorsDtypeOf(t.scalar_type()));
    entry.shape = t.sizes().vec();
    entries.push_back(std::move(entry));
    bytes.push_back(t.contiguous());
  }
  ASSIGN_OR_RETURN(SafetensorsWriter w,
                   SafetensorsWriter::Create(path, entries, {{"format", "pt"}}, writer));
  for (size_t i = 0; i < entries.size(); ++i) {
    RETURN_IF_ERROR(w.Append(entries[i].name, bytes[i].data_ptr(), bytes[i].nbytes()));
  }
  RETURN_IF_ERROR(w.Finish());
  RETURN_IF_ERROR(SyncFile(path));  // the rename reaches the disk too
  return FileDigest{rel, w.size(), w.crc32()};
}

absl::StatusOr<std::vector<FileDigest>> WriteLayerFiles(
    const std::string& root, const std::vector<std::pair<std::string, LayerDict>>& layers,
    int writer, bool pending) {
  std::vector<absl::StatusOr<FileDigest>> written(layers.size(), absl::UnknownError("not written"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < layers.size();) {
      written[i] = WriteLayerFile(root,
                                  pending ? PendingLayerFileOf(layers[i].first)
                                          : LayerFileOf(kCheckpointFormat, layers[i].first),
                                  layers[i].second, writer);
    }
  };
  std::thread other;
  if (layers.size() > 1) {
    try {
      other = std::thread(work);
    } catch (const std::system_error&) {  // one at a time, then
    }
  }
  work();
  if (other.joinable()) other.join();
  std::vector<FileDigest> out;
  for (auto& w : written) {
    if (!w.ok()) return w.status();
    out.push_back(*std::move(w));
  }
  return out;
}

absl::StatusOr<LayerDict> UnpickleLayer(const std::vector<char>& bytes, const std::string& what) {
  LayerDict in;
  RETURN_IF_ERROR(TorchCall(absl::StrCat("loading ", what), [&] {
    auto d = torch::pickle_load(bytes).toGenericDict();
    for (const auto& e : d) in.insert(e.key().toStringRef(), e.value().toTensor());
  }));
  return in;
}

absl::StatusOr<LayerDict> ReadLayerFile(const std::string& file, int64_t* bytes_read) {
  if (absl::EndsWith(file, ".safetensors")) {
    absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(file);
    if (!reader.ok()) return absl::DataLossError(std::string(reader.status().message()));
    LayerDict out;
    uint64_t size = 0;
    for (const SafetensorsEntry& e : reader->tensors()) {
      absl::StatusOr<at::ScalarType> type = ScalarTypeOf(e.dtype);
      if (!type.ok()) {
        return absl::DataLossError(
            absl::StrCat(file, ": '", e.name, "': ", type.status().message()));
      }
      at::Tensor t;
      RETURN_IF_ERROR(TorchCall(absl::StrCat("reading ", file), [&] {
        t = torch::empty(e.shape, torch::TensorOptions().dtype(*type));
      }));
      RETURN_IF_ERROR(reader->Read(e, t.data_ptr()));
      out.insert(e.name, std::move(t));
      size = std::max(size, e.end);
    }
    if (bytes_read != nullptr) *bytes_read += static_cast<int64_t>(size);
    return out;
  }
  auto data = ReadRegularFile(file, kMaxCheckpointFileBytes, "checkpoint layer");
  if (!data.ok()) return absl::DataLossError(std::string(data.status().message()));
  if (bytes_read != nullptr) *bytes_read += static_cast<int64_t>(data->size());
  std::vector<char> bytes(data->begin(), data->end());
  data->clear();
  return UnpickleLayer(bytes, file);
}

}  // namespace varuna

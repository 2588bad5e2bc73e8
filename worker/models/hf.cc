#include "worker/models/hf.h"

#include <caffe2/serialize/inline_container.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/storage_context.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/checkpoint/safetensors.h"
#include "worker/dist/torch_status.h"
#include "worker/models/layer_file.h"

namespace varuna {
namespace {

torch::Dtype TorchDtype(const std::string& st) {
  if (st == "BF16") return torch::kBFloat16;
  if (st == "F16") return torch::kHalf;
  return torch::kFloat;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Names older BERT files use for a tensor: the tied bias's other name, LayerNorm's gamma and
// beta (the original TensorFlow port), no "bert." prefix (saved from BertModel).
const SafetensorsEntry* FindBertAlias(const HfWeights& weights, const std::string& name,
                                      const SafetensorsReader** shard) {
  std::vector<std::string> names;
  if (name == "cls.predictions.bias") names.push_back("cls.predictions.decoder.bias");
  for (const auto& [now, old] :
       {std::pair<std::string, std::string>{"LayerNorm.weight", "LayerNorm.gamma"},
        {"LayerNorm.bias", "LayerNorm.beta"}}) {
    if (absl::EndsWith(name, now)) {
      names.push_back(name.substr(0, name.size() - now.size()) + old);
    }
  }
  const size_t direct = names.size();
  names.push_back(name);
  for (size_t i = 0; i <= direct; ++i) {
    if (absl::StartsWith(names[i], "bert.")) names.push_back(names[i].substr(5));
  }
  for (const std::string& n : names) {
    if (const SafetensorsEntry* e = weights.Find(n, shard)) return e;
  }
  return nullptr;
}

bool IsTiedSecond(const ModelSpec& spec, const std::string& name) {
  for (const auto& [first, second] : TiedParameters(spec)) {
    if (name == second) return true;
  }
  return false;
}

// Note [Mapped layer files]: a checkpoint layer file is mapped read-only and its tensors are
// views of the mapping: in format 2 (safetensors) at the offsets its header gives; in format 1
// (torch::pickle_save of a dict: a zip whose data.pkl names storages data/0, data/1, ...) each
// storage is handed to the unpickler as a view (a DeserializationStorageContext filled
// beforehand). So loading copies nothing and only the pages of tensors actually read become
// resident. Export touches the parameters and never the optimizer state beside them, a
// piece at a time, and gives each piece's pages back once written (MappedLayer::Release), so
// its memory is a piece, not a layer.
class MappedLayer {
 public:
  static absl::StatusOr<std::unique_ptr<MappedLayer>> Open(const std::string& path) {
    auto m = std::unique_ptr<MappedLayer>(new MappedLayer);
    ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, "checkpoint layer"));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": empty or unreadable"));
    }
    m->size_ = static_cast<size_t>(st.st_size);
    m->base_ = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m->base_ == MAP_FAILED) {
      m->base_ = nullptr;
      return absl::InternalError(absl::StrCat("cannot map ", path));
    }
    if (absl::EndsWith(path, ".safetensors")) {
      // Format 2: the header gives every tensor's place in the file, checked against its size.
      absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
      if (!reader.ok()) return absl::DataLossError(std::string(reader.status().message()));
      for (const SafetensorsEntry& e : reader->tensors()) {
        if (e.end > m->size_) return absl::DataLossError(absl::StrCat(path, ": the file shrank"));
        ASSIGN_OR_RETURN(at::ScalarType type, ScalarTypeOf(e.dtype));
        RETURN_IF_ERROR(TorchCall(absl::StrCat("reading ", path), [&] {
          m->dict_.insert(e.name, torch::from_blob(static_cast<char*>(m->base_) + e.begin, e.shape,
                                                   torch::TensorOptions().dtype(type)));
        }));
      }
      ::madvise(m->base_, m->size_, MADV_SEQUENTIAL);
      return m;
    }
    RETURN_IF_ERROR(TorchCall(absl::StrCat("reading ", path), [&]() -> absl::Status {
      caffe2::serialize::PyTorchStreamReader reader(path);
      auto context = std::make_shared<torch::jit::DeserializationStorageContext>();
      std::map<std::string, size_t> limit;  // storage key -> bytes from its offset to the end
      for (const std::string& record : reader.getAllRecords()) {
        if (!absl::StartsWith(record, "data/")) continue;
        const size_t offset = reader.getRecordOffset(record);
        if (offset >= m->size_) return absl::DataLossError(absl::StrCat(path, ": bad record"));
        const std::string key = record.substr(5);
        limit[key] = m->size_ - offset;
        at::DataPtr ptr(static_cast<char*>(m->base_) + offset, nullptr, &c10::detail::deleteNothing,
                        at::kCPU);
        context->addStorage(key, c10::Storage(c10::Storage::use_byte_size_t(), m->size_ - offset,
                                              std::move(ptr), nullptr, /*resizable=*/false));
      }
      // No type resolver, object loader or device.
      auto dict =
          torch::jit::readArchiveAndTensors("data", "", "", {}, {}, {}, reader,
                                            torch::jit::Unpickler::defaultTypeParser, context)
              .toGenericDict();
      for (const auto& e : dict) {
        const at::Tensor t = e.value().toTensor();
        // Every tensor must lie inside its record (a checkpoint is verified before export;
        // this keeps a damaged one from reading past the mapping anyway).
        const size_t end = (t.storage_offset() + t.numel()) * t.element_size();
        if (!t.is_contiguous() || end > t.storage().nbytes()) {
          return absl::DataLossError(
              absl::StrCat(path, ": tensor ", e.key().toStringRef(), " lies outside its record"));
        }
        m->dict_.insert(e.key().toStringRef(), t);
      }
      return absl::OkStatus();
    }));
    ::madvise(m->base_, m->size_, MADV_SEQUENTIAL);
    return m;
  }
  ~MappedLayer() {
    dict_.clear();
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  // Drops the mapped pages under [p, p + bytes) from this process (the file stays in the
  // page cache): a streaming reader keeps resident only the piece it is working on.
  void Release(const void* p, size_t bytes) const {
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t base = reinterpret_cast<uintptr_t>(base_);
    uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
    if (bytes == 0 || begin < base || end > base + size_) return;
    begin = begin / page * page;
    end = std::min((end + page - 1) / page * page, base + size_);
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
  // The parameters ("param.<key>" entries) by key, sorted.
  std::map<std::string, at::Tensor> Params() const {
    std::map<std::string, at::Tensor> out;
    for (const auto& e : dict_) {
      const std::string& k = e.key();
      if (absl::StartsWith(k, "param.")) out.emplace(k.substr(6), e.value());
    }
    return out;
  }

 private:
  MappedLayer() = default;
  void* base_ = nullptr;
  size_t size_ = 0;
  c10::Dict<std::string, at::Tensor> dict_;
};

// Export converts and writes a tensor in pieces of this many elements (16 MB of fp32).
constexpr int64_t kPieceElems = int64_t{4} << 20;

const char* const kTokenizerFiles[] = {"tokenizer.json",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "tokenizer.model",
                                       "vocab.json",
                                       "merges.txt",
                                       "added_tokens.json",
                                       "generation_config.json"};

// One parameter to export: the index of its layer in the checkpoint, its key in the layer
// file and its entry in the output.
struct ExportItem {
  size_t layer;
  std::string key;
  SafetensorsEntry entry;
};

// Checks the options, verifies the checkpoint and reads its common part into *common;
// returns its model (an error names what export needs).
absl::StatusOr<ModelSpec> ReadExportCheckpoint(const std::string& ckpt_path,
                                               const HfExportOptions& options,
                                               CheckpointCommon* common) {
  if (options.dtype != "F32" && options.dtype != "BF16" && options.dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype ", options.dtype, ": use fp32, bf16 or fp16"));
  }
  RETURN_IF_ERROR(VerifyCheckpoint(ckpt_path));
  ASSIGN_OR_RETURN(*common, ReadCheckpointCommon(ckpt_path));
  absl::StatusOr<ModelSpec> spec = ParseModelSpecLine(common->model_spec);
  if (!spec.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(ckpt_path, ": cannot tell its model (", spec.status().message(),
                     "); only checkpoints of model.kind llama or gpt2 export to Hugging Face"));
  }
  return spec;
}

// Pass 1 of the export: every parameter's name and shape (the header comes first), layer by
// layer; sets stats->largest_layer_bytes.
absl::StatusOr<std::vector<ExportItem>> ListExportItems(const std::string& ckpt_path,
                                                        const CheckpointCommon& common,
                                                        const ModelSpec& spec,
                                                        const HfExportOptions& options, int item,
                                                        HfExportStats* stats) {
  std::vector<ExportItem> items;
  for (size_t l = 0; l < common.layers.size(); ++l) {
    const std::string file =
        absl::StrCat(ckpt_path, "/", LayerFileOf(common.format, common.layers[l]));
    if (RolledLayer(ckpt_path, common.format, common.layers[l])) {
      // Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc: only a resume applies
      // the step's update to it.
      return absl::FailedPreconditionError(absl::StrCat(
          ckpt_path, " holds layer ", common.layers[l], " only as step ", common.step - 1,
          " with step ", common.step,
          "'s gradients (a rolled rescue), which only a resume "
          "applies: resume the job and export a checkpoint it writes, or export an older step"));
    }
    ASSIGN_OR_RETURN(auto mapped, MappedLayer::Open(file));
    uint64_t layer_bytes = 0;
    for (const auto& [key, t] : mapped->Params()) {
      SafetensorsEntry e;
      e.name = absl::StrCat(common.layers[l], ".", key);
      if (IsTiedSecond(spec, e.name)) continue;  // Hugging Face's files hold one copy
      e.dtype = options.dtype;
      e.shape = t.sizes().vec();
      layer_bytes += static_cast<uint64_t>(t.numel()) * item;
      items.push_back({l, key, std::move(e)});
    }
    stats->largest_layer_bytes = std::max(stats->largest_layer_bytes, layer_bytes);
  }
  return items;
}

// Splits the items into shards: greedy in model order, a new one when the next tensor would
// pass max_shard_bytes; adds the tensors' bytes to stats->bytes.
std::vector<std::vector<SafetensorsEntry>> PlanShards(const std::vector<ExportItem>& items,
                                                      int item, uint64_t max_shard_bytes,
                                                      HfExportStats* stats) {
  std::vector<std::vector<SafetensorsEntry>> shards(1);
  uint64_t in_shard = 0;
  for (const ExportItem& it : items) {
    const uint64_t bytes = static_cast<uint64_t>(it.entry.numel()) * item;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(it.entry);
    in_shard += bytes;
    stats->bytes += bytes;
  }
  return shards;
}

// The file name of shard i of n.
std::string ShardName(int i, int n) {
  return n == 1 ? std::string("model.safetensors")
                : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
}

// Creates the output directory and removes the weights of an earlier export from it.
absl::Status PrepareExportDir(const std::string& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out, ": ", ec.message()));
  // Weights of an earlier export into OUT would be read instead of (or beside) these: a
  // loader prefers model.safetensors, or the index, whichever is there.
  for (std::filesystem::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"))) {
      std::error_code rm;
      std::filesystem::remove(it->path(), rm);
    }
  }
  return absl::OkStatus();
}

// Pass 2 of the export: the data, one mapped layer at a time, in the order of pass 1, into
// the shards of PlanShards; records each tensor's shard in *weight_map.
absl::Status WriteExportShards(const std::string& ckpt_path, const CheckpointCommon& common,
                               const std::vector<ExportItem>& items,
                               const std::vector<std::vector<SafetensorsEntry>>& shards,
                               const HfExportOptions& options, const std::string& out,
                               HfExportStats* stats,
                               std::vector<std::pair<std::string, std::string>>* weight_map) {
  const int n = static_cast<int>(shards.size());
  int shard = 0;
  ASSIGN_OR_RETURN(
      SafetensorsWriter writer,
      SafetensorsWriter::Create(out + "/" + ShardName(0, n), shards[0], {{"format", "pt"}}));
  size_t in_this_shard = 0;
  for (size_t i = 0; i < items.size();) {
    const size_t l = items[i].layer;
    const std::string file =
        absl::StrCat(ckpt_path, "/", LayerFileOf(common.format, common.layers[l]));
    ASSIGN_OR_RETURN(auto mapped, MappedLayer::Open(file));
    const auto params = mapped->Params();
    for (; i < items.size() && items[i].layer == l; ++i) {
      const ExportItem& it = items[i];
      auto found = params.find(it.key);
      if (found == params.end()) {
        return absl::DataLossError(absl::StrCat(file, ": '", it.key, "' vanished"));
      }
      // Piece by piece (kPieceElems at a time): convert, append, drop the source pages.
      RETURN_IF_ERROR(TorchCall("converting " + it.entry.name, [&]() -> absl::Status {
        const torch::Tensor flat = found->second.reshape({-1});
        const torch::Dtype to = TorchDtype(options.dtype);
        const int64_t n = flat.numel();
        for (int64_t off = 0; off < n || off == 0; off += kPieceElems) {
          const torch::Tensor piece = flat.narrow(0, off, std::min(kPieceElems, n - off));
          const torch::Tensor out_piece = piece.scalar_type() == to ? piece : piece.to(to);
          RETURN_IF_ERROR(writer.Append(it.entry.name, out_piece.data_ptr(),
                                        static_cast<uint64_t>(out_piece.nbytes())));
          mapped->Release(piece.data_ptr(), piece.nbytes());
          if (n == 0) break;
        }
        return absl::OkStatus();
      }));
      weight_map->emplace_back(it.entry.name, ShardName(shard, n));
      ++stats->tensors;
      if (++in_this_shard == shards[shard].size()) {
        RETURN_IF_ERROR(writer.Finish());
        if (++shard < n) {
          ASSIGN_OR_RETURN(writer, SafetensorsWriter::Create(out + "/" + ShardName(shard, n),
                                                             shards[shard], {{"format", "pt"}}));
          in_this_shard = 0;
        }
      }
    }
  }
  if (items.empty()) RETURN_IF_ERROR(writer.Finish());
  return absl::OkStatus();
}

// Copies the tokenizer's files found in `tokenizer` to `out`, counting them in
// stats->tokenizer_files (a warning when there are none). Only regular files of that
// directory (Note [Files of a model directory] in common/checkpoint/hf_weights.cc: not a link
// to /etc/shadow), each keeping its mode; an export run as root copies nothing the
// directory's owner could not have put there.
absl::Status CopyTokenizerFiles(const std::string& tokenizer, const std::string& out,
                                HfExportStats* stats) {
  for (const char* name : kTokenizerFiles) {
    if (!CheckRegularFile(absl::StrCat(tokenizer, "/", name), "tokenizer file").ok()) continue;
    ASSIGN_OR_RETURN(const int fd, OpenModelFile(tokenizer, name, "tokenizer file"));
    struct stat st {};
    const mode_t mode = ::fstat(fd, &st) == 0 ? (st.st_mode & 0777) : 0644;
    absl::StatusOr<std::string> bytes =
        ReadRegularFile(absl::StrCat("/proc/self/fd/", fd), 1 << 30, "tokenizer file");
    ::close(fd);
    if (!bytes.ok()) return bytes.status();
    const std::string to = absl::StrCat(out, "/", name);
    RETURN_IF_ERROR(WriteFileAtomic(to, *bytes, 0));
    if (::chmod(to.c_str(), mode) != 0) {
      return absl::InternalError(absl::StrCat("cannot set the mode of ", to));
    }
    ++stats->tokenizer_files;
  }
  if (stats->tokenizer_files == 0) {
    LOG(WARNING) << "tokenizer directory " << tokenizer << " holds no tokenizer files";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadHfLayer(const HfWeights& weights, const ModelSpec& spec, const std::string& dir,
                         const std::string& layer, torch::nn::Module& module,
                         std::set<std::string>* upcast) {
  return TorchCall(absl::StrCat("loading ", layer, " from ", dir), [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    for (auto& p : module.named_parameters(/*recurse=*/true)) {
      const std::string name = absl::StrCat(layer, ".", p.key());
      const SafetensorsReader* shard = nullptr;
      const SafetensorsEntry* e = weights.Find(name, &shard);
      if (e == nullptr && spec.kind == "gpt2" && absl::StartsWith(name, "transformer.")) {
        e = weights.Find(name.substr(12), &shard);  // saved from GPT2Model: no prefix
      }
      if (e == nullptr && spec.kind == "bert") e = FindBertAlias(weights, name, &shard);
      if (e == nullptr) {
        if (IsTiedSecond(spec, name)) continue;  // TieAtStart copies it from the first
        return absl::NotFoundError(
            absl::StrCat("model.init_from ", dir, " has no tensor '", name, "'"));
      }
      if (e->shape != p.value().sizes().vec()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model.init_from ", dir, ": tensor '", e->name, "' has shape ", ShapeText(e->shape),
            " but the model's ", name, " is ", ShapeText(p.value().sizes().vec())));
      }
      if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16") {
        return absl::FailedPreconditionError(absl::StrCat("model.init_from ", dir, ": tensor '",
                                                          e->name, "' is ", e->dtype,
                                                          " (F32, BF16 or F16 can be loaded)"));
      }
      torch::Tensor buf = torch::empty(e->shape, torch::dtype(TorchDtype(e->dtype)));
      RETURN_IF_ERROR(shard->Read(*e, buf.data_ptr()));
      if (e->dtype != "F32") upcast->insert(e->dtype);
      p.value().copy_(buf);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<HfExportStats> ExportHf(const std::string& ckpt_path, const std::string& out,
                                       const HfExportOptions& options) {
  CheckpointCommon common;
  ASSIGN_OR_RETURN(ModelSpec spec, ReadExportCheckpoint(ckpt_path, options, &common));
  const std::string torch_dtype = options.dtype == "F32"    ? "float32"
                                  : options.dtype == "BF16" ? "bfloat16"
                                                            : "float16";
  ASSIGN_OR_RETURN(std::string config, HfConfigJson(spec, torch_dtype));
  const int item = SafetensorsDtypeBytes(options.dtype);

  HfExportStats stats;
  stats.step = common.step;
  ASSIGN_OR_RETURN(std::vector<ExportItem> items,
                   ListExportItems(ckpt_path, common, spec, options, item, &stats));
  const std::vector<std::vector<SafetensorsEntry>> shards =
      PlanShards(items, item, options.max_shard_bytes, &stats);
  const int n = static_cast<int>(shards.size());
  RETURN_IF_ERROR(PrepareExportDir(out));

  std::vector<std::pair<std::string, std::string>> weight_map;
  RETURN_IF_ERROR(
      WriteExportShards(ckpt_path, common, items, shards, options, out, &stats, &weight_map));
  stats.shards = n;
  if (n > 1) {
    std::sort(weight_map.begin(), weight_map.end());
    RETURN_IF_ERROR(WriteFileAtomic(out + "/model.safetensors.index.json",
                                    HfIndexJson(stats.bytes, weight_map), 0));
  }
  RETURN_IF_ERROR(WriteFileAtomic(out + "/config.json", config, 0));
  const std::string tokenizer =
      options.tokenizer_dir.empty() ? common.tokenizer_dir : options.tokenizer_dir;
  // The checkpoint's word, written by the job: whoever runs the export should know whose
  // directory it copies from (varuna-ckpt warns).
  if (options.tokenizer_dir.empty()) stats.tokenizer_from_checkpoint = tokenizer;
  if (!tokenizer.empty()) RETURN_IF_ERROR(CopyTokenizerFiles(tokenizer, out, &stats));
  return stats;
}

}  // namespace varuna

// The "torchscript" model kind: segments exported by scripts/export_torchscript.py, each a
// scripted module loaded with LibTorch's torch::jit::load.

#include <torch/script.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/base/safe_file.h"
#include "worker/models/builtin.h"
#include "worker/models/model.h"

namespace varuna {

namespace {

// A TorchScript segment: forward(x, input_ids, labels). Its parameters are registered on this
// module (dots replaced by '_') so optimizers and checkpoints see them.
class ScriptLayer : public Layer {
 public:
  explicit ScriptLayer(torch::jit::Module m) : module_(std::move(m)) {
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      register_parameter(absl::StrReplaceAll(p.name, {{".", "_"}}), p.value);
    }
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap& in) override {
    module_.train(is_training());
    torch::Tensor ids = in.at("input_ids");
    return module_.forward({x.defined() ? x : ids, ids, in.at("labels")}).toTensor();
  }

 private:
  torch::jit::Module module_;
};

}  // namespace

absl::StatusOr<Model> ScriptModel(const ModelSpec& s) {
  Model m;
  for (int i = 0;; ++i) {
    const std::string path = absl::StrCat(s.path, "/segment_", i, ".pt");
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      if (i == 0) return absl::NotFoundError(absl::StrCat("no TorchScript segment at ", path));
      break;
    }
    if (i >= kMaxLayers) return absl::InvalidArgumentError("more than 4096 TorchScript segments");
    // A segment must be a regular file (no FIFO or device; never blocks).
    if (absl::Status st = CheckRegularFile(path, "TorchScript segment"); !st.ok()) return st;
    // Cost = file size (parameter bytes dominate); each stage loads only its own segments.
    const double bytes = static_cast<double>(std::filesystem::file_size(path, ec));
    if (i > 0) m.Add(CutPoint{});
    m.Add(absl::StrCat("segment_", i), std::max(1.0, bytes), [path] {
      torch::jit::Module module;
      try {
        module = torch::jit::load(path);
      } catch (const c10::Error& e) {
        // Re-thrown with the file named; TorchCall turns it into the status.
        TORCH_CHECK(false, "cannot load TorchScript segment ", path, ": ",
                    e.what_without_backtrace());
      }
      return std::make_shared<ScriptLayer>(std::move(module));
    });
    // Note: a corrupt file or a wrong forward() signature fails when its stage builds it or
    // in the dry run, with the file named; the start-up agreement stops every rank.
  }
  return m;
}

}  // namespace varuna

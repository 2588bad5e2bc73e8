#include "worker/models/registry.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/models/builtin.h"

namespace varuna {

absl::StatusOr<Model> BuildModel(const ModelSpec& spec, const TensorParallel& tp) {
  if (tp.enabled()) RETURN_IF_ERROR(CheckTensorParallel(spec, tp.size));
  if (spec.kind == "gpt") return GptModel(spec, tp);
  if (spec.kind == "mlp") return MlpModel(spec, tp);
  if (spec.kind == "torchscript") return ScriptModel(spec);
  if (spec.kind == "llama") return LlamaModel(spec, tp);
  if (spec.kind == "gpt2") return Gpt2Model(spec);
  if (spec.kind == "bert") return BertModel(spec);
  return absl::InvalidArgumentError(absl::StrCat("unknown model kind '", spec.kind, "'"));
}

}  // namespace varuna

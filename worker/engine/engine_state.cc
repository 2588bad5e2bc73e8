#include "worker/engine/engine_state.h"

#include "absl/strings/str_cat.h"

namespace varuna {

std::vector<torch::Tensor> EngineView::parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& [name, p] : s_->named_params) params.push_back(p);
  return params;
}

std::vector<std::string> EngineView::model_layer_names() const {
  std::vector<std::string> names;
  for (const auto& def : s_->model.layers()) names.push_back(def.name);
  return names;
}

std::map<std::string, ShardSpec> EngineView::sharded_parameters() const {
  std::map<std::string, ShardSpec> out;
  for (size_t i = 0; i < s_->layers.size(); ++i) {
    for (const auto& [name, spec] : s_->layer_shards[i]) {
      out[absl::StrCat(s_->layer_names[i], ".", name)] = spec;
    }
  }
  return out;
}

}  // namespace varuna

#include "worker/models/model.h"

#include <torch/torch.h>

#include <utility>

namespace varuna {

Model& Model::Add(std::string name, double cost, Factory factory) {
  layers_.push_back({std::move(name), cost, std::move(factory)});
  return *this;
}

Model& Model::Add(CutPoint) {
  const int at = static_cast<int>(layers_.size());
  if (at > 0 && (cuts_.empty() || cuts_.back() != at)) cuts_.push_back(at);
  return *this;
}

Model& Model::Tie(std::string first, std::string second) {
  tied_.emplace_back(std::move(first), std::move(second));
  return *this;
}

std::vector<std::vector<int>> Model::Segments() const {
  std::vector<std::vector<int>> segments(1);
  size_t cut = 0;
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    if (cut < cuts_.size() && cuts_[cut] == i && !segments.back().empty()) {
      segments.emplace_back();
      ++cut;
    }
    segments.back().push_back(i);
  }
  return segments;
}

std::vector<double> Model::SegmentCosts() const {
  std::vector<double> costs;
  for (const auto& seg : Segments()) {
    double c = 0;
    for (int i : seg) c += layers_[i].cost;
    costs.push_back(c);
  }
  return costs;
}

std::shared_ptr<Layer> BuildLayer(const Model& model, int index, uint64_t seed,
                                  torch::Device device) {
  torch::manual_seed(seed * 1000003ULL + static_cast<uint64_t>(index));
  auto layer = model.layers()[index].factory();
  layer->to(device);
  layer->train();
  return layer;
}

}  // namespace varuna

#pragma once

// Models as ordered layers with cut points (ARCHITECTURE "Model").
//
// A Model is a sequence of layers. A CutPoint between two layers marks a place where a stage
// boundary may go; the layers between consecutive cut points form a segment, the unit of
// partitioning. Every layer maps (activation, raw inputs) -> activation: raw inputs (token
// ids, labels, masks) reach every stage from the data loader, only the activation crosses a
// stage boundary. The last layer returns the scalar loss (mean over its micro-batch).
//
// Layers are created lazily from factories so a stage builds only its own layers. The engine
// seeds the RNG per layer index before calling a factory, so initial weights do not depend on
// the partitioning.

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "worker/models/tensor_parallel.h"

namespace varuna {

using TensorMap = std::map<std::string, torch::Tensor>;

// One layer of a model. `x` is undefined for the first layer of the model.
class Layer : public torch::nn::Module {
 public:
  virtual torch::Tensor Forward(const torch::Tensor& x, const TensorMap& inputs) = 0;
};

// Marker for a possible stage boundary (Varuna's CutPoint), used with Model::Add.
struct CutPoint {};

class Model {
 public:
  using Factory = std::function<std::shared_ptr<Layer>()>;

  // Appends a layer. `cost` is its relative compute cost (e.g. forward FLOPs per sample),
  // used to balance stages. Names must be unique; parameter names are "<name>.<param>".
  Model& Add(std::string name, double cost, Factory factory);
  // Appends a cut point. Consecutive cut points, or one at either end, are ignored.
  Model& Add(CutPoint);
  // Declares two parameters (full names) as tied: both hold the same initial value, their
  // gradients are summed, so they stay identical (embedding <-> LM head).
  Model& Tie(std::string first, std::string second);

  struct LayerDef {
    std::string name;
    double cost;
    Factory factory;
  };
  // Segments in order; each is the list of its layer indices.
  std::vector<std::vector<int>> Segments() const;
  std::vector<double> SegmentCosts() const;
  int num_segments() const { return static_cast<int>(Segments().size()); }
  const std::vector<LayerDef>& layers() const { return layers_; }
  const std::vector<std::pair<std::string, std::string>>& tied() const { return tied_; }

 private:
  std::vector<LayerDef> layers_;
  std::vector<int> cuts_;  // cut before layer index i
  std::vector<std::pair<std::string, std::string>> tied_;
};

// Creates layer `index` of `model` on `device`, in training mode. Note [Init]: the RNG is
// seeded from (seed, layer index) first, so initial weights depend on neither the
// partition nor the process (the engine and the profiler build layers alike).
std::shared_ptr<Layer> BuildLayer(const Model& model, int index, uint64_t seed,
                                  torch::Device device);

}  // namespace varuna

#include "worker/models/builtin.h"

namespace varuna {
namespace {

class Head : public Layer {
 public:
  Head(int vocab, int d) {
    torch::NoGradGuard g;
    weight_ = register_parameter("weight", torch::randn({vocab, d}) * 0.02);
  }
  torch::Tensor Forward(const torch::Tensor& x, const TensorMap& in) override {
    auto logits = torch::matmul(x, weight_.t());
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), in.at("labels").reshape({-1}));
  }

 private:
  torch::Tensor weight_;
};

}  // namespace

std::shared_ptr<Layer> LmHead(int vocab, int d) { return std::make_shared<Head>(vocab, d); }

}  // namespace varuna

// The baseline of benchmark (a): the same model, data, optimizer and batch as a P=1 D=1
// varuna-worker run, trained by the plainest LibTorch loop (one forward over the whole batch,
// backward, clip, step). Writes the same JSON lines as varuna-worker --metrics_out.
//
// Usage: bench_plain_loop --job JOB.yaml --metrics_out FILE [--steps N]

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/spec/job_spec.h"
#include "worker/engine/data.h"
#include "worker/engine/lr_schedule.h"
#include "worker/engine/optimizer.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

int main(int argc, char** argv) {
  varuna::InitLogging(argv[0]);
  std::string job, out;
  int64_t steps = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--job") job = argv[i + 1];
    if (a == "--metrics_out") out = argv[i + 1];
    if (a == "--steps") steps = std::stoll(argv[i + 1]);
  }
  auto spec = varuna::LoadJobSpec(job);
  if (!spec.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  if (steps >= 0) spec->train.steps = steps;
  auto model = varuna::BuildModel(spec->model);
  auto data = varuna::TokenDataset::Open(spec->data, spec->model.seq_len, spec->model.vocab,
                                         spec->train.seed);
  if (!model.ok() || !data.ok()) {
    std::fprintf(stderr, "error: %s\n",
                 std::string((model.ok() ? data.status() : model.status()).message()).c_str());
    return 1;
  }
  // Same per-layer init as the engine (Note [Init] in worker/models/model.h).
  std::vector<std::shared_ptr<varuna::Layer>> layers;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t k = 0; k < model->layers().size(); ++k) {
    torch::manual_seed(spec->train.seed * 1000003ULL + k);
    layers.push_back(model->layers()[k].factory());
    for (auto& p : layers.back()->named_parameters()) {
      named.emplace_back(model->layers()[k].name + "." + p.key(), p.value());
    }
  }
  torch::Tensor wte, head;
  for (auto& [n, p] : named) {
    if (n == "embed.wte") wte = p;
    if (n == "head.lm_head") head = p;
  }
  if (wte.defined() && head.defined()) {
    torch::NoGradGuard g;
    head.copy_(wte);
  }
  std::vector<torch::Tensor> params;
  for (auto& [n, p] : named) params.push_back(p);
  auto opt = varuna::MakeOptimizer(spec->train, named);
  std::ofstream metrics(out);
  const auto& t = spec->train;
  const int64_t B = t.global_batch;
  for (int64_t step = 1; step <= t.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    auto read = data->Batch((step - 1) * B, B);
    if (!read.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(read.status().message()).c_str());
      return 1;
    }
    auto& batch = *read;
    torch::Tensor h;
    for (auto& l : layers) h = l->Forward(h, batch);
    h.backward();
    if (wte.defined() && head.defined()) {
      auto sum = wte.grad() + head.grad();
      wte.mutable_grad().copy_(sum);
      head.mutable_grad().copy_(sum);
    }
    double norm = 0;
    if (t.clip_grad_norm > 0) norm = torch::nn::utils::clip_grad_norm_(params, t.clip_grad_norm);
    const double lr = varuna::LearningRate(t.schedule, t.lr, t.min_lr, t.warmup, t.steps, step);
    for (auto& g : opt->param_groups()) g.options().set_lr(lr);
    opt->step();
    opt->zero_grad();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    metrics << absl::StrFormat(
        "{\"step\": %d, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, \"step_time_s\": %.6f, "
        "\"samples_per_s\": %.3f, \"tokens_per_s\": %.1f}\n",
        step, h.item<double>(), norm, lr, dt, B / dt, B * spec->model.seq_len / dt);
  }
  return 0;
}

#include "worker/engine/gradient_reducer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>
#include <map>

#include "common/base/status_macros.h"
#include "worker/dist/comm.h"
#include "worker/dist/torch_status.h"

namespace varuna {

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    std::vector<ReducedParameter> params,
    const std::vector<std::pair<std::string, std::string>>& tied, ProcessGroupPtr tied_group,
    GradientReducerOptions options) {
  std::unique_ptr<GradientReducer> r(new GradientReducer(std::move(tied_group), options));
  RETURN_IF_ERROR(TorchCall("laying out the gradient buckets", [&] {
    r->LayOut(params, tied);
    if (r->options_.overlap) r->RegisterHooks();
  }));
  return r;
}

// Note [Data-parallel reduction]: a parameter's gradient is summed over the holders of its
// segment (one rank per pipeline). Parameters are grouped by that holder set, in layer order;
// each group's gradients are packed into flat buckets and sum-all-reduced over the group's
// ranks (the loss was already divided by the global batch, so the sum is the mean gradient).
// Buckets are laid out once, in launch order: the backward produces gradients from the last
// layer to the first, so buckets are filled in that order (the first at most
// first_bucket_bytes, the rest bucket_bytes). Tied parameters get buckets of their own, posted
// last: their gradients are complete only after ReduceTied(). Whatever the hooks did not post
// (everything, without overlap; tied parameters; parameters without a gradient) is posted by
// Finish(), in order; a rank's groups are all different process groups, so no order between
// them can deadlock.
void GradientReducer::LayOut(const std::vector<ReducedParameter>& params,
                             const std::vector<std::pair<std::string, std::string>>& tied) {
  std::map<ProcessGroup*, int> group_of;
  for (const ReducedParameter& p : params) {
    if (p.group) {
      auto it = group_of.find(p.group.get());
      if (it == group_of.end()) {
        it = group_of.emplace(p.group.get(), static_cast<int>(groups_.size())).first;
        groups_.emplace_back();
        groups_.back().pg = p.group;
      }
      groups_[it->second].params.push_back(static_cast<int>(params_.size()));
    }
    params_.push_back(p.tensor);
  }
  std::vector<bool> is_tied(params.size(), false);
  for (const auto& [first, second] : tied) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].name == first || params[i].name == second) is_tied[i] = true;
    }
  }
  bucket_of_param_.assign(params_.size(), {-1, -1});
  grad_view_.assign(params_.size(), torch::Tensor());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    for (bool tied_pass : {false, true}) {
      int64_t numel = 0, cap = std::max<int64_t>(1, options_.first_bucket_bytes / 4);
      bool open = false;
      for (auto it = g.params.rbegin(); it != g.params.rend(); ++it) {
        const int i = *it;
        if (is_tied[i] != tied_pass) continue;
        if (!open || (numel > 0 && numel + params_[i].numel() > cap)) {
          if (open) cap = std::max<int64_t>(1, options_.bucket_bytes / 4);
          g.bucket_of.emplace_back();
          numel = 0;
          open = true;
        }
        g.bucket_of.back().push_back(i);
        // Tied buckets are never posted by the hooks (their count never reaches zero).
        if (!tied_pass) {
          bucket_of_param_[i] = {static_cast<int>(gi), static_cast<int>(g.bucket_of.size()) - 1};
        }
        numel += params_[i].numel();
      }
    }
    for (const auto& b : g.bucket_of) {
      int64_t n = 0;
      bool viewable = true;
      for (int i : b) {
        n += params_[i].numel();
        const torch::Tensor& p = params_[i];
        viewable = viewable && p.scalar_type() == torch::kFloat && p.is_contiguous() &&
                   p.device() == options_.device;
      }
      g.buckets.push_back(torch::zeros({n}, torch::dtype(torch::kFloat).device(options_.device)));
      g.viewed.push_back(viewable);
      g.missing.push_back(static_cast<int>(b.size()));
      if (!viewable) continue;
      int64_t off = 0;
      for (int i : b) {
        grad_view_[i] = g.buckets.back().narrow(0, off, params_[i].numel()).view_as(params_[i]);
        off += params_[i].numel();
      }
    }
  }
  // The tied copies on this stage (their values were made equal at start-up).
  std::map<std::string, torch::Tensor> mine;
  for (const ReducedParameter& p : params) mine.emplace(p.name, p.tensor);
  for (const auto& [first, second] : tied) {
    const bool has_first = mine.count(first) > 0, has_second = mine.count(second) > 0;
    if (has_first && has_second) {
      tied_.push_back({mine[first], false, mine[second]});
      tied_.push_back({mine[second], true, mine[first]});
    } else if (has_first || has_second) {
      tied_.push_back({has_first ? mine[first] : mine[second], !has_first, torch::Tensor()});
    }
  }
}

// Note [Gradients as bucket views]: as DDP's gradient_as_bucket_view, a parameter's gradient
// is a view of its flat bucket, so the backward accumulates straight into what the all-reduce
// sums and the sum is already the gradient: nothing is copied in or out (two passes over every
// gradient per step before), and a gradient costs no memory beside its bucket. The buckets
// are zeroed once per step before the first backward (one memset each); the first
// micro-batch's gradient is then added to zeros instead of taken as it is, the price DDP pays
// too. A bucket whose parameters are not all contiguous fp32 on the bucket's device keeps the
// copies, and so does a gradient something replaced (checked per parameter by its address);
// PrepareStep gives it its view back.
void GradientReducer::PrepareStep() {
  std::lock_guard<std::mutex> l(mu_);
  torch::NoGradGuard no_grad;
  for (Group& g : groups_) {
    for (size_t b = 0; b < g.buckets.size(); ++b) {
      if (!g.viewed[b]) continue;
      g.buckets[b].zero_();
      for (int i : g.bucket_of[b]) {
        if (!GradIsView(i)) params_[i].mutable_grad() = grad_view_[i];
      }
    }
  }
}

bool GradientReducer::GradIsView(int i) const {
  const torch::Tensor& grad = params_[i].grad();
  return grad_view_[i].defined() && grad.defined() && grad.data_ptr() == grad_view_[i].data_ptr();
}

void GradientReducer::ReleaseGradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grad_view_[i].defined()) params_[i].mutable_grad() = torch::Tensor();
  }
}

// Note [Tied weights]: the first parameter of a pair is the source of truth at start-up; its
// value is copied (locally, or from stage 0 to stage P-1 over the tied group) into the second
// (Varuna::Build, after checking the placement on every rank). After every backward their
// gradients are summed here, so both copies get identical updates.
absl::Status GradientReducer::ReduceTied() {
  std::vector<torch::Tensor> remote;
  RETURN_IF_ERROR(TorchCall("tied gradients", [&] {
    for (auto& t : tied_) {
      if (t.local_partner.defined()) {
        if (!t.second) {
          t.param.mutable_grad().add_(t.local_partner.grad());
          t.local_partner.mutable_grad().copy_(t.param.grad());
        }
      } else {
        remote.push_back(t.param.grad());
      }
    }
  }));
  if (remote.empty()) return absl::OkStatus();
  return AllReduceSum(tied_group_, remote, options_.timeout);
}

bool GradientReducer::IsSecondCopy(const torch::Tensor& param) const {
  for (const Tied& t : tied_) {
    if (t.second && t.param.is_same(param)) return true;
  }
  return false;
}

int GradientReducer::num_buckets() const {
  int n = 0;
  for (const Group& g : groups_) n += static_cast<int>(g.bucket_of.size());
  return n;
}

void GradientReducer::Arm() {
  std::lock_guard<std::mutex> l(mu_);
  armed_ = options_.overlap;
}

// Note [Overlapped all-reduce]: a post-hook on each parameter's gradient accumulator (what
// DDP hooks) fires once the backward has added that parameter's gradient. While armed (the
// last micro-batch's backward of the step), it counts the bucket's missing gradients down;
// buckets are posted strictly in their launch order, the same on every member of the group,
// so collectives match. Posting copies the gradients into the bucket: they are final, so the
// bucket holds exactly what the non-overlapped path would copy after the pipeline, and the
// sum is bit-identical. Tied parameters' buckets wait for ReduceTied().
void GradientReducer::RegisterHooks() {
  for (const Group& g : groups_) {
    for (int i : g.params) {
      auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
      if (!acc) continue;
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, i](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
            OnGradReady(i);
            return outputs;
          }));
      grad_accs_.push_back(std::move(acc));
    }
  }
}

void GradientReducer::DeferredGradientsReady(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].is_same(p)) OnGradReady(static_cast<int>(i));
    }
  }
}

void GradientReducer::OnGradReady(int param) {
  std::lock_guard<std::mutex> l(mu_);
  if (!armed_) return;
  const auto [gi, b] = bucket_of_param_[param];
  if (gi < 0) return;
  --groups_[gi].missing[b];
  LaunchReadyBuckets();
}

void GradientReducer::LaunchReadyBuckets() {
  torch::NoGradGuard no_grad;
  for (Group& g : groups_) {
    while (g.next < g.bucket_of.size() && g.missing[g.next] <= 0) {
      const size_t b = g.next++;
      int64_t off = 0;
      for (int i : g.bucket_of[b]) {
        const int64_t n = params_[i].numel();
        // A gradient that is its view is already there (Note [Gradients as bucket views]).
        if (!GradIsView(i)) g.buckets[b].narrow(0, off, n).copy_(params_[i].grad().reshape({-1}));
        off += n;
      }
      g.works.push_back(g.pg->AllReduceSum(g.buckets[b], options_.timeout));
    }
  }
}

absl::Status GradientReducer::Finish() {
  std::lock_guard<std::mutex> l(mu_);
  armed_ = false;
  if (groups_.empty()) return absl::OkStatus();
  absl::Status st = TorchCall("data-parallel all-reduce", [&]() -> absl::Status {
    last_early_buckets_ = 0;
    for (Group& g : groups_) last_early_buckets_ += static_cast<int>(g.next);
    for (Group& g : groups_) std::fill(g.missing.begin(), g.missing.end(), 0);
    LaunchReadyBuckets();
    for (Group& g : groups_) {
      for (auto& w : g.works) w->Wait(options_.timeout);
    }
    torch::NoGradGuard no_grad;
    for (Group& g : groups_) {
      for (size_t b = 0; b < g.bucket_of.size(); ++b) {
        int64_t off = 0;
        for (int i : g.bucket_of[b]) {
          const int64_t n = params_[i].numel();
          if (!GradIsView(i)) {
            params_[i].mutable_grad().copy_(g.buckets[b].narrow(0, off, n).view_as(params_[i]));
          }
          off += n;
        }
      }
    }
    return absl::OkStatus();
  });
  ResetStep(/*abort=*/!st.ok());
  return st;
}

void GradientReducer::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  armed_ = false;
  ResetStep(/*abort=*/true);
}

void GradientReducer::ResetStep(bool abort) {
  for (Group& g : groups_) {
    if (abort) {
      for (auto& w : g.works) w->Abort();
    }
    g.works.clear();
    g.next = 0;
    g.missing.clear();
    for (const auto& b : g.bucket_of) g.missing.push_back(static_cast<int>(b.size()));
  }
}

}  // namespace varuna

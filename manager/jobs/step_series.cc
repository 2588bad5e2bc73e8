#include "manager/jobs/step_series.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/pipeline/partition.h"
#include "common/pipeline/topology.h"
#include "common/planner/profile.h"
#include "common/spec/job_topology.h"
#include "glog/logging.h"

namespace varuna {

void StepSeries::Record(Job& job, const v1::WorkerStatus& w) {
  if (w.steps().empty()) return;
  // Every rank reports every step, through one agent per node: the metrics take each step
  // once per generation (below).
  std::vector<v1::StepRecord> records;
  for (const v1::StepMetrics& s : w.steps()) {
    // A non-finite loss (a diverged step) is recorded as it is: every step appears once.
    if (s.step() < 1 || s.step() > job.info().total_steps()) continue;
    v1::StepRecord r;
    r.set_step(s.step());
    r.set_loss(s.loss());
    r.set_generation(w.generation());  // an adopted survivor's may be the one before
    r.set_samples_per_s(std::isfinite(s.samples_per_s()) ? s.samples_per_s() : 0);
    r.set_step_time_s(std::isfinite(s.step_time_s()) ? s.step_time_s() : 0);
    auto finite = [](double v) { return std::isfinite(v) ? v : 0.0; };
    r.set_tokens_per_s(finite(s.tokens_per_s()));
    r.set_grad_norm(finite(s.grad_norm()));
    r.set_lr(finite(s.lr()));
    r.set_bubble_ratio(finite(s.bubble_ratio()));
    r.set_mfu(finite(s.mfu()));
    if (s.has_eval_loss()) r.set_eval_loss(s.eval_loss());
    for (double v : s.stage_busy_s()) r.add_stage_busy_s(finite(v));
    for (double v : s.stage_wait_s()) r.add_stage_wait_s(finite(v));
    r.set_merged(1);
    job.gen.newest_step = std::max<int64_t>(job.gen.newest_step, s.step());
    records.push_back(std::move(r));
  }
  if (records.empty()) return;
  if (metrics_) {
    // Each step once per generation, whichever report brings it first: the reports of two
    // ranks (or nodes) can arrive newest first, so "newer than the newest seen" would drop
    // the older one's steps.
    std::vector<bool>& counted = job.gen.counted_steps;
    if (counted.size() < static_cast<size_t>(job.info().total_steps()) + 1) {
      counted.resize(static_cast<size_t>(job.info().total_steps()) + 1, false);
    }
    std::vector<v1::StepRecord> fresh;
    for (const v1::StepRecord& r : records) {
      if (counted[r.step()]) continue;
      counted[r.step()] = true;
      fresh.push_back(r);
    }
    metrics_->OnSteps(job.info().id(), fresh);
  }
  v1::StepRecord& newest = newest_[job.info().id()];
  for (const v1::StepRecord& r : records) {
    if (r.step() >= newest.step()) newest = r;
  }
  absl::Status st = store_->SaveSteps(job.info().id(), records);
  if (!st.ok()) LOG(WARNING) << JobWho(job.info()) << " cannot store step records: " << st;
  // Note [Step series]: at most kMaxStepPoints records per job; past that the older half is
  // thinned (each removed record merged into its kept neighbour), so a week-long job keeps
  // its whole curve at decreasing resolution and the newest steps at full.
  st = store_->ThinSteps(job.info().id(), kMaxStepPoints);
  if (!st.ok()) LOG(WARNING) << JobWho(job.info()) << " cannot thin step records: " << st;
}

absl::StatusOr<v1::GetMetricsResponse> StepSeries::Get(const v1::GetMetricsRequest& req) const {
  ASSIGN_OR_RETURN(std::vector<v1::StepRecord> steps,
                   store_->LoadSteps(req.job_id(), req.after_step(), 100000));
  // A page: at most kMaxReplyBytes (at least one record); the caller asks again after the
  // last step it got (varunactl metrics and the dashboard do), so no series is too big to read.
  v1::GetMetricsResponse resp;
  size_t bytes = 0;
  for (auto& s : steps) {
    const size_t size = s.ByteSizeLong() + 8;
    if (resp.steps_size() > 0 && bytes + size > kMaxReplyBytes) break;
    bytes += size;
    *resp.add_steps() = std::move(s);
  }
  return resp;
}

const v1::StepRecord* StepSeries::Newest(const std::string& job_id) const {
  auto it = newest_.find(job_id);
  return it == newest_.end() ? nullptr : &it->second;
}

absl::StatusOr<v1::GetStagesResponse> DescribeStages(const Job& job, const v1::Profile* stored,
                                                     const v1::StepRecord* newest) {
  const v1::JobInfo& info = job.info();
  v1::GetStagesResponse resp;
  if (info.placement().empty() || info.stages() < 1) return resp;  // not placed yet
  Topology topo;
  if (!info.pipelines().empty()) {
    ASSIGN_OR_RETURN(topo, Topology::Parse(info.pipelines()));
  } else {
    // Only the rank -> stage mapping matters here: any batch the replicas divide will do.
    ASSIGN_OR_RETURN(topo, Topology::Uniform(info.stages(), info.replicas(), info.replicas()));
    if (info.boundaries_size() == info.stages() + 1) {
      RETURN_IF_ERROR(topo.SetUniformBoundaries(
          std::vector<int>(info.boundaries().begin(), info.boundaries().end())));
    }
  }
  // Costs per segment: the stored profile, else the built-in cost model (FLOPs).
  absl::StatusOr<v1::Profile> profile =
      stored ? absl::StatusOr<v1::Profile>(*stored) : BuiltinProfile(job.spec);
  std::vector<double> cost, forward;
  if (profile.ok()) {
    for (const auto& seg : profile->segments()) {
      const SegmentTimes t = CostAt(seg, std::max(1, info.micro_batch()));
      cost.push_back(t.forward_s + t.backward_s);
      forward.push_back(t.forward_s);
    }
  }
  // No boundaries in the plan (placement rule): the workers cut by the same FLOP costs.
  if (!topo.has_boundaries() && !forward.empty() && topo.uniform()) {
    if (auto bounds = PartitionByCost(forward, info.stages()); bounds.ok()) {
      topo.SetUniformBoundaries(*bounds).IgnoreError();
    }
  }
  std::vector<std::string> labels;  // per segment
  if (topo.has_boundaries()) {
    if (auto m = SegmentLabels(job.spec.model, topo.pipeline(0).boundaries.back()); m.ok()) {
      labels = *std::move(m);
    }
    if (static_cast<int>(cost.size()) != topo.pipeline(0).boundaries.back()) cost.clear();
  }
  std::map<int, std::string> node_of = PositionNodes(info);
  for (int r = 0; r < topo.world_size(); ++r) {
    v1::StageInfo* s = resp.add_stages();
    s->set_rank(r);
    s->set_node(node_of.count(r) ? node_of[r] : "");
    const int k = topo.PipelineOf(r), st = topo.StageOf(r);
    s->set_pipeline(k);
    s->set_stage(st);
    if (!topo.has_boundaries()) continue;
    const auto [a, b] = topo.SegmentsOf(r);
    for (int g = a; g < b && g < static_cast<int>(labels.size()); ++g) s->add_layers(labels[g]);
    if (static_cast<int>(cost.size()) >= b) {
      double mine = 0, total = 0;
      for (int g = 0; g < static_cast<int>(cost.size()); ++g) {
        total += cost[g];
        if (g >= a && g < b) mine += cost[g];
      }
      s->set_cost(total > 0 ? mine / total : 0);
    }
    if (k == 0 && newest != nullptr && newest->generation() == info.generation() &&
        st < newest->stage_busy_s_size() && st < newest->stage_wait_s_size()) {
      s->set_busy_s(newest->stage_busy_s(st));
      s->set_wait_s(newest->stage_wait_s(st));
    }
  }
  return resp;
}

}  // namespace varuna

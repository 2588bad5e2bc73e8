#include "worker/runtime/step_reporter.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/launch/worker_protocol.h"
#include "common/net/proto_json.h"
#include "varuna/v1/types.pb.h"
#include "worker/runtime/events.h"

namespace varuna {

absl::Status StepReporter::Open(const WorkerTopology& topo, const std::string& who, bool append) {
  topo_ = topo;
  who_ = who;
  // The last stage of pipeline 0 reports the step (the loss is global after the step); one
  // process per position reports (its tp rank 0).
  metrics_rank_ = topo.rank == topo.topology.pipeline(0).stages() - 1 && topo.tp_rank == 0;
  writes_ = !metrics_out_.empty() && topo.tp_rank == 0 && (metrics_rank_ || all_ranks_);
  if (file_.is_open()) file_.close();
  // A rank that no longer reports closes its event file; one that still does keeps it (no
  // other file was begun meanwhile, so TensorBoard reads them in order).
  if (!metrics_rank_) tensorboard_.reset();
  // A kept file marks the new generation's first step with a session start: a morph may have
  // resumed from an older step, and TensorBoard then drops the steps it redoes.
  session_start_ = tensorboard_ != nullptr;
  if (!writes_) return absl::OkStatus();
  const std::string path =
      metrics_rank_ ? metrics_out_ : absl::StrCat(metrics_out_, ".rank", topo.rank);
  file_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!file_) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_out '", path, "' cannot be written"));
  }
  return absl::OkStatus();
}

void StepReporter::Report(int64_t step, const StepResult& r, double dt, double lr,
                          double loss_scale, std::optional<double> eval_loss) {
  const int64_t B = topo_.global_batch;
  // One schema for --metrics_out and the agent: the StepMetrics message (as JSON here, as the
  // step event's payload there).
  v1::StepMetrics m;
  m.set_step(step);
  m.set_loss(r.loss);
  m.set_grad_norm(r.grad_norm);
  m.set_lr(lr);
  m.set_overflow(r.overflow);
  m.set_step_time_s(dt);
  m.set_samples_per_s(B / dt);
  m.set_tokens_per_s(B * seq_len_ / dt);
  m.set_at(UnixNow());
  m.set_pipeline_s(r.pipeline_s);
  m.set_recv_wait_s(r.wait_s);
  m.set_host_syncs(r.host_syncs);
  m.set_loss_scale(loss_scale);
  m.set_bubble_ratio(r.bubble_ratio);
  // MFU (Note [MFU] in device.h): 6 N FLOPs per token (forward + backward) over the world's
  // peak.
  if (peak_flops_ > 0) {
    m.set_mfu(6.0 * static_cast<double>(r.model_parameters) * m.tokens_per_s() /
              (peak_flops_ * topo_.world_size));
  }
  if (eval_loss) m.set_eval_loss(*eval_loss);
  for (double v : r.stage_busy_s) m.add_stage_busy_s(v);
  for (double v : r.stage_wait_s) m.add_stage_wait_s(v);
  if (static_cast<int>(r.rank_busy_s.size()) <= kMaxRankValues) {
    for (double v : r.rank_busy_s) m.add_rank_busy_s(v);
    for (double v : r.rank_wait_s) m.add_rank_wait_s(v);
  }
  if (writes_) {
    file_ << ProtoJson(m) << "\n";
    file_.flush();
  }
  if (metrics_rank_ && !tensorboard_dir_.empty()) WriteTensorBoard(m);
  {
    v1::WorkerEvent e;
    e.set_t(m.at());
    *e.mutable_step() = m;
    ReportToAgent(std::move(e));
  }
  if ((topo_.rank == 0 && topo_.tp_rank == 0) || metrics_rank_) {
    if (step == 1 || step % 10 == 0 || step == topo_.steps || eval_loss) {
      LOG(INFO) << who_ << " step=" << step << " loss=" << absl::StrFormat("%.4f", r.loss)
                << " grad_norm=" << absl::StrFormat("%.3f", r.grad_norm)
                << " step_time_s=" << absl::StrFormat("%.3f", dt)
                << (eval_loss ? absl::StrFormat(" eval_loss=%.4f", *eval_loss) : "")
                << (r.overflow ? " overflow=skipped" : "");
    }
  }
}

void StepReporter::WriteTensorBoard(const v1::StepMetrics& m) {
  const int64_t step = m.step();
  if (!tensorboard_) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> w =
        TensorBoardWriter::Open(tensorboard_dir_, step);
    if (!w.ok()) {
      LOG(ERROR) << who_ << " TensorBoard off for the rest of the run: " << w.status();
      tensorboard_dir_.clear();
      return;
    }
    tensorboard_ = *std::move(w);
  }
  absl::Status st;
  if (session_start_) {
    st = tensorboard_->SessionStart(step);
    session_start_ = false;
  }
  auto put = [&](const char* tag, double v) {
    if (st.ok()) st = tensorboard_->Scalar(tag, step, v);
  };
  if (!generation_text_.empty() && st.ok()) {
    st = tensorboard_->Text("generation", step, generation_text_);
    generation_text_.clear();
  }
  put("train/loss", m.loss());
  if (m.has_eval_loss()) put("eval/loss", m.eval_loss());
  put("train/lr", m.lr());
  put("train/grad_norm", m.grad_norm());
  put("train/tokens_per_s", m.tokens_per_s());
  put("train/samples_per_s", m.samples_per_s());
  if (m.mfu() > 0) put("train/mfu", m.mfu());
  if (st.ok()) st = tensorboard_->Flush();
  if (!st.ok()) {
    LOG(ERROR) << who_ << " TensorBoard off for the rest of the run: " << st;
    tensorboard_.reset();
    tensorboard_dir_.clear();
  }
}

}  // namespace varuna

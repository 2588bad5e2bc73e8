#pragma once

// One step's record, once: the StepMetrics message written to --metrics_out (JSON lines, by
// the last stage of pipeline 0, or every rank with --metrics_all_ranks), sent to the agent as
// the step event, logged every 10 steps, and (observability.tensorboard_dir) written as
// TensorBoard scalars by the same rank, with each generation's shape as a text event.

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/base/tensorboard_writer.h"
#include "common/launch/launch_args.h"
#include "varuna/v1/types.pb.h"
#include "worker/engine/varuna.h"

namespace varuna {

class StepReporter {
 public:
  StepReporter(std::string metrics_out, bool all_ranks, int seq_len)
      : metrics_out_(std::move(metrics_out)), all_ranks_(all_ranks), seq_len_(seq_len) {}

  // Each rank's peak FLOP/s on its device (PeakFlops), for MFU; 0 (the default): no MFU.
  void set_peak_flops(double peak) { peak_flops_ = peak; }
  // (Re)opens the metrics file for this rank's place in `topo` (appending after a morph in
  // place, where the rank that reports now may be another); an unwritable file is an error.
  absl::Status Open(const WorkerTopology& topo, const std::string& who, bool append);
  // The job's observability.tensorboard_dir ("" = none). The reporting rank opens a new event
  // file at its first Report (a session start at that step: Note [Event files] in
  // common/base/tensorboard_writer.cc).
  void set_tensorboard_dir(std::string dir) { tensorboard_dir_ = std::move(dir); }
  // Whether this rank is the one that reports the step (after Open).
  bool reports() const { return metrics_rank_; }
  // A generation begins: `text` (its shape and why) goes to TensorBoard at its first step.
  void Generation(std::string text) { generation_text_ = std::move(text); }
  // Records step `step` of `r`, which took `dt` seconds at learning rate `lr`, with the
  // validation loss where the step computed one.
  void Report(int64_t step, const StepResult& r, double dt, double lr, double loss_scale,
              std::optional<double> eval_loss = std::nullopt);

 private:
  void WriteTensorBoard(const v1::StepMetrics& m);

  const std::string metrics_out_;
  const bool all_ranks_;
  double peak_flops_ = 0;  // per rank, for MFU (0: unknown)
  const int seq_len_;
  WorkerTopology topo_;
  std::string who_;
  std::ofstream file_;
  bool writes_ = false;        // this rank writes the file
  bool metrics_rank_ = false;  // the last stage of pipeline 0, tp rank 0
  std::string tensorboard_dir_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // the reporting rank's, from its first step
  std::string generation_text_;                     // to write at the next step
  bool session_start_ = false;  // a kept file's new generation: a session start first
};

}  // namespace varuna

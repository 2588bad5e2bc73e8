#pragma once

// One run of the varuna-worker program (RunWorker), its phases as methods, in the order Run
// calls them: check the input, connect (device, backend, process groups), start the engine,
// restore its state (join in place, resume, or Hugging Face weights), train generation after
// generation (regrouping in place between them: Note [Morph in place] in
// worker/engine/regroup.cc), evaluate. What the run shares with its signal handlers is in
// ProcessState; the rescue thread is a Rescuer; each step's record goes out through a
// StepReporter.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data/sample_log.h"
#include "common/launch/launch_args.h"
#include "common/launch/worker_channel.h"
#include "common/spec/job_spec.h"
#include "worker/dist/process_group.h"
#include "worker/engine/data.h"
#include "worker/engine/fault.h"
#include "worker/engine/pipeline_executor.h"
#include "worker/engine/regroup.h"
#include "worker/engine/varuna.h"
#include "worker/models/model.h"
#include "worker/runtime/rescuer.h"
#include "worker/runtime/step_reporter.h"
#include "worker/runtime/timeline_out.h"

namespace varuna {

class WorkerRun {
 public:
  explicit WorkerRun(std::vector<std::string> argv);
  // Runs the worker; OK after the last step (or --help, --list_modules, a stop on request).
  absl::Status Run();

 private:
  // What the command line and the job spec say, checked before any rendezvous.
  struct Input {
    WorkerArgs args;
    JobSpec spec;
    std::optional<Model> model;
    WorkerTopology topo;
    SchedulePolicy policy = SchedulePolicy::kVaruna;
    Precision precision = Precision::kFp32;
    std::optional<TokenDataset> data;
    std::optional<TokenDataset> eval_data;  // the spec's eval.data
    SampleLog sample_log;       // data.sample_log (Note [Sample log] in common/data/sample_log.h)
    int64_t profile_batch = 0;  // the job's global batch, for a profile run
    int num_segments = 0;
    bool has_tied = false;
    std::string who;  // "job=NAME rank=R", for the log
  };
  // How this rank reaches the others.
  struct Link {
    std::chrono::milliseconds timeout{0};
    torch::Device device{torch::kCPU};
    Backend backend = Backend::kGloo;
    std::optional<ProcessGroups> groups;    // until the engine takes them
    std::optional<FaultInjector> faults;    // likewise
    std::chrono::milliseconds step_min{0};  // VARUNA_STEP_MIN_MS (tests)
  };

  // The phases. `*done` says the run ended there (--help, --list_modules).
  absl::Status CheckInput(bool* done);
  absl::Status Connect();
  absl::Status StartEngine();
  absl::Status Restore();
  absl::Status ResumeFromCheckpoint();
  void ReportReady(int64_t resumed_from, const HandoverStats* handed, double regroup_s);
  // One generation's steps: true when training ended (done or stopped), false when this
  // process regroups.
  absl::StatusOr<bool> TrainGeneration();
  absl::StatusOr<bool> TrainSteps();  // its loop
  absl::Status CheckpointAfter(int64_t step, bool stop);
  std::map<std::string, std::string> CheckpointInfo(int64_t step) const;
  // After a failed step or validation: reports this rank parked (false: it regroups), or
  // rescues and exits.
  bool ParkAfterFailure(int64_t step, const absl::Status& why);
  absl::Status Regroup();
  // The validation loss after `step` where the job's eval section asks for one then.
  absl::StatusOr<std::optional<double>> ValidateAfter(int64_t step);
  absl::Status Evaluate();

  // One generation's engine: the stage of `t`, over `g`, optimizer and schedule set.
  absl::StatusOr<std::unique_ptr<Varuna>> BuildEngine(Model m, const WorkerTopology& t,
                                                      ProcessGroups g, FaultInjector f,
                                                      SchedulePolicy schedule);

  const std::vector<std::string> argv_;
  const EnvGetter env_;
  std::unique_ptr<AgentCommandListener> agent_commands_;
  std::unique_ptr<StartupWatch> startup_;
  Input in_;
  Link link_;
  std::unique_ptr<StepReporter> reporter_;
  std::unique_ptr<TimelineOut> timeline_;  // --timeline_out; outlives every engine
  VarunaOptions base_opts_;
  std::unique_ptr<Varuna> engine_;
  int64_t first_step_ = 1;
  std::optional<HandoverStats> joined_;  // a joiner's hand-over
  std::map<std::string, std::string> ckpt_info_;
  // What the run has come to.
  struct Progress {
    bool stopped = false;        // on request, after a checkpoint
    std::string generation_why;  // VARUNA_GENERATION_WHY, then each reconfigure's
    // The newest validation (step, loss); a rescue reads it on its own thread.
    void SetLastEval(int64_t step, double loss) {
      std::lock_guard<std::mutex> l(eval_mu);
      last_eval = {step, loss};
    }
    std::optional<std::pair<int64_t, double>> LastEval() const {
      std::lock_guard<std::mutex> l(eval_mu);
      return last_eval;
    }

   private:
    mutable std::mutex eval_mu;
    std::optional<std::pair<int64_t, double>> last_eval;
  } done_;
  // Last: destroyed first, while the engine it may rescue still exists.
  std::unique_ptr<Rescuer> rescuer_;
};

}  // namespace varuna

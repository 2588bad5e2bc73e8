#pragma once

// The job spec (YAML), parsed into typed structs with strict validation: unknown keys are
// errors naming the key, values are range-checked, cross-field rules live in Validate().

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/pipeline/limits.h"
#include "common/spec/data_spec.h"
#include "common/spec/model_spec.h"

namespace varuna {

// Limits on what a job spec may ask for (docs/job_spec.md "Limits"; the shape bounds kMaxSlots
// and kMaxGlobalBatch are in common/pipeline/limits.h).
inline constexpr size_t kMaxJobSpecBytes = 1 << 20;
inline constexpr int64_t kMaxEnvFileBytes = 1 << 20;
inline constexpr size_t kMaxEnvEntries = 4096;
inline constexpr int kMaxLayers = 4096;
inline constexpr int64_t kMaxSteps = 1000000000;
inline constexpr int64_t kMaxEvalSamples = 10000000;

// A shell variable name: [A-Za-z_][A-Za-z0-9_]*, at most 256 characters.
bool IsValidEnvKey(absl::string_view key);

// Validation (docs/job_spec.md "eval"): the loss over `samples` held-out samples of `data`,
// forward only through the pipeline, every `every_steps` steps and after the last.
struct EvalSpec {
  bool enabled = false;  // the spec has an eval section
  DataSpec data;
  int64_t every_steps = 0;  // 0: after the last step only
  int64_t samples = 0;      // 0: the global batch
};

// What the job reports beyond its metrics (docs/observability.md "TensorBoard").
struct ObservabilitySpec {
  // The rank that reports the loss writes TensorBoard event files here ("" = none).
  std::string tensorboard_dir;
};

struct TrainSpec {
  int64_t global_batch = 16;  // samples per optimizer step, over all replicas
  int64_t steps = 100;
  std::string optimizer = "adamw";  // adamw | sgd
  double lr = 1e-3;
  double min_lr = 0.0;              // floor of the cosine/linear decay
  int64_t warmup = 0;               // linear warm-up steps
  std::string schedule = "cosine";  // cosine | linear | constant (after warm-up)
  double clip_grad_norm = 1.0;      // 0 disables clipping
  double weight_decay = 0.0;        // AdamW decoupled decay; SGD L2
  double beta1 = 0.9;
  double beta2 = 0.95;
  double momentum = 0.9;           // sgd only
  std::string precision = "fp32";  // fp32 | bf16 | fp16
  // auto (a GPU when the worker has CUDA and sees one) | cpu | cuda (GPU LOCAL_RANK mod the
  // GPU count) | cuda:N
  std::string device = "auto";
  double init_loss_scale = 65536.0;  // fp16 only
  int64_t loss_scale_window = 1000;  // fp16 only: clean steps before the scale doubles
  uint64_t seed = 1;
};

// One entry of parallel.pipelines (heterogeneous pipelines, docs/heterogeneous.md): `count`
// pipelines that run `stages` (module names per stage, see varuna-worker --list_modules), each
// reading `microbatches` micro-batches of parallel.micro_batch samples per step.
struct PipelineEntrySpec {
  std::vector<std::vector<std::string>> stages;
  int count = 1;
  int microbatches = 0;  // 0: not given (an error)
};

struct ParallelSpec {
  int stages = 0;                   // 0 = auto
  int micro_batch = 0;              // 0 = auto
  int replicas = 0;                 // data-parallel width; 0 = as many as the slots allow
  std::string schedule = "varuna";  // varuna | gpipe | 1f1b | zb-h1 | auto (AutoConfig picks)
  // Tensor-parallel ranks per stage (Note [Tensor parallelism] in
  // worker/models/tensor_parallel.cc): WORLD_SIZE = (ranks of the stage map or pipelines) x
  // tp_size. 0 = auto: the manager's AutoConfig picks it per plan (Note [Tensor-parallel plans]); 1
  // elsewhere.
  int tp_size = 1;
  double timeout_s = 300;  // collective / p2p timeout
  // Instead of stages x replicas: pipelines of different depths side by side.
  std::vector<PipelineEntrySpec> pipelines;
};

struct CheckpointSpec {
  std::string dir;
  int64_t every_steps = 0;
  int keep = 0;
  std::string tempdir;
  // Every replica of a stage writes its share of the stage's layers (Note [Sharded writes] in
  // worker/engine/checkpoint.cc); false: replica 0 of each stage writes them all.
  bool shard = true;
  // A rescue also writes what a peer behind or ahead of its rank needs to reach the newest
  // step (Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc; nothing is copied per
  // step); false writes its own step alone, at the price of a possible fallback to an older
  // checkpoint when a failure splits a step on the relaunch path.
  bool commit = true;
  // Where a run starts: "" = fresh, "latest" = the newest complete checkpoint in dir (fresh
  // if there is none), or a step number. varuna-worker's --resume_step overrides it.
  std::string resume;
};

struct ResourcesSpec {
  int min_slots = 1;
  int max_slots = 0;  // 0 = no limit
  // A morph waits this long in RECONFIGURING for min_slots to be alive, then fails the job.
  double max_wait_s = 600;
};

// Stragglers (docs/job_spec.md "stragglers"): how a job treats a node slower than its peers.
// Unset fields (policy "", numbers 0, min_gain < 0) take the manager's defaults
// (ManagerConfig::stragglers).
struct StragglerSpec {
  // "auto" (detect and act), "report" (detect, event only), "off"; "" = the default.
  std::string policy;
  // A node is slow when its smoothed relative speed is below this; (0, 1).
  double slow_below = 0;
  // Steps in the smoothing window (median); [2, 1000].
  int window_steps = 0;
  // Act only when the simulator predicts at least this fraction faster; [0, 1).
  double min_gain = -1;
  // An evicted node is probed for re-admission after this long; [1, 604800].
  double probation_s = 0;
  // A probe at or above this fraction of the node's baseline re-admits it; (0, 1].
  double recovered_above = 0;
};
// `job`'s fields where set, else `defaults`' (which has every field set).
StragglerSpec ResolveStragglers(const StragglerSpec& job, const StragglerSpec& defaults);
// InvalidArgument naming the field and its range for any set field out of range (and an unknown
// policy: "stragglers.policy must be auto, report or off, not 'x'"); `what` prefixes the message
// ("stragglers" in a job spec). With require_all, unset fields are errors too (the manager's
// defaults). recovered_above must be above slow_below when both are set. A job's fields and the
// manager's defaults are each valid alone; their mix from ResolveStragglers is checked by the
// caller with require_all.
absl::Status ValidateStragglers(const StragglerSpec& s, const std::string& what, bool require_all);

struct JobSpec {
  std::string name = "job";
  ModelSpec model;
  DataSpec data;
  EvalSpec eval;
  ObservabilitySpec observability;
  TrainSpec train;
  ParallelSpec parallel;
  CheckpointSpec checkpoint;
  ResourcesSpec resources;
  StragglerSpec stragglers;
  std::vector<std::string> entrypoint;
  // Where a user entrypoint starts on every node (Varuna's --code_dir); checked by the agent
  // before launch. Empty = the generation's work directory.
  std::string code_dir;
  // false: a lost node or a failed worker fails the job (Varuna's no_morphing). true needs
  // checkpoint.dir for the state to survive a morph.
  bool morphing = true;
  // The priority class (docs/operations.md "Sharing a cluster"): high, normal, low or a class
  // the manager config adds; the manager checks it at submit.
  std::string priority = "normal";
  std::map<std::string, std::string> env;
  // KEY=VALUE lines added to env (env: entries win). varunactl reads it on the submitting
  // machine and sends the merged env, so the manager normally sees this empty.
  std::string env_file;

  // Cross-field rules (heads | d_model, text data needs vocab >= 256, ...). Does not touch
  // the filesystem; see ValidateFiles().
  absl::Status Validate() const;
  // Shapes no cluster could ever run (fixed stages x replicas outside [min_slots, max_slots],
  // global_batch not divisible by fixed replicas). Checked at submit only, so a manager that
  // recovers jobs stored before a rule was added still starts.
  absl::Status ValidateShape() const;
  // parallel.pipelines without the model: counts, micro-batch counts, the batch they add up
  // to, identical templates with different counts (part of Validate()).
  absl::Status ValidatePipelines() const;
  // Checks that referenced files are readable regular files, and that a model.init_from
  // spec carries the architecture its config.json has (ResolveInitFrom fills it in). Opens
  // never block (a FIFO is refused, not waited on); still, callers on an event loop run it
  // elsewhere.
  absl::Status ValidateFiles() const;
};

// Parses YAML text into a validated JobSpec. Errors name the offending key path, e.g.
// "job spec: unknown key 'train.lrr'".
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text);
// Reads and parses a job file; NotFound naming the path if it cannot be read.
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

}  // namespace varuna

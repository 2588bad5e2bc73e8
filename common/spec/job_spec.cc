#include "common/spec/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/data/manifest.h"
#include "common/pipeline/pipeline_template.h"
#include "common/spec/job_topology.h"
#include "common/spec/spec_reader.h"

namespace varuna {
namespace {

using spec_detail::Bad;
using spec_detail::Finite;
using spec_detail::InRange;
using spec_detail::MapReader;
using spec_detail::OneOf;

// env: KEY: VALUE, every value a single scalar, every key a shell variable name.
absl::Status ReadEnv(const YAML::Node& node, std::map<std::string, std::string>* env) {
  if (!node || node.IsNull()) return absl::OkStatus();
  return ForEachEntry(
      node, "job spec", "env", [&](const std::string& key, const YAML::Node& v) -> absl::Status {
        if (!IsValidEnvKey(key)) {
          return Bad(absl::StrCat("env.", key),
                     "is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)");
        }
        ASSIGN_OR_RETURN(std::string value, YamlScalar(v, "job spec", absl::StrCat("env.", key)));
        (*env)[key] = std::move(value);
        return absl::OkStatus();
      });
}

// The keys of a stragglers block, in the order they are checked.
constexpr const char* kStragglerKeys[] = {"policy",   "slow_below",  "window_steps",
                                          "min_gain", "probation_s", "recovered_above"};

absl::Status StragglerRange(const std::string& what, const char* key, double value, double lo,
                            bool lo_open, double hi, bool hi_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) &&
                  (hi_open ? value < hi : value <= hi);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ".", key, " is ", value, "; must be a finite number in ",
                   lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]"));
}

// Whether `key` of `s` is set (the unset values are in job_spec.h). NaN counts as set, so it
// is refused rather than replaced by the default.
bool StragglerFieldSet(const StragglerSpec& s, absl::string_view key) {
  if (key == "policy") return !s.policy.empty();
  if (key == "slow_below") return s.slow_below != 0;
  if (key == "window_steps") return s.window_steps != 0;
  if (key == "min_gain") return !(s.min_gain < 0);
  if (key == "probation_s") return s.probation_s != 0;
  return s.recovered_above != 0;  // recovered_above
}

// Checks `key` of `s` as though it were set: an unset value is out of range too. The parser
// calls it for every key a spec writes, so `slow_below: 0` or `min_gain: -0.5` is an error,
// not a silent fall-back to the manager's default.
absl::Status CheckStragglerField(const StragglerSpec& s, const std::string& what,
                                 absl::string_view key) {
  if (key == "policy") {
    if (s.policy == "auto" || s.policy == "report" || s.policy == "off") return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".policy must be auto, report or off, not '", s.policy, "'"));
  }
  if (key == "slow_below") {
    return StragglerRange(what, "slow_below", s.slow_below, 0, true, 1, true);
  }
  if (key == "window_steps") {
    if (s.window_steps >= 2 && s.window_steps <= 1000) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, ".window_steps is ", s.window_steps,
                                                   "; must be an integer in [2, 1000]"));
  }
  if (key == "min_gain") return StragglerRange(what, "min_gain", s.min_gain, 0, false, 1, true);
  if (key == "probation_s") {
    return StragglerRange(what, "probation_s", s.probation_s, 1, false, 604800, false);
  }
  return StragglerRange(what, "recovered_above", s.recovered_above, 0, true, 1, false);
}

}  // namespace

StragglerSpec ResolveStragglers(const StragglerSpec& job, const StragglerSpec& defaults) {
  StragglerSpec r = job;
  if (!StragglerFieldSet(job, "policy")) r.policy = defaults.policy;
  if (!StragglerFieldSet(job, "slow_below")) r.slow_below = defaults.slow_below;
  if (!StragglerFieldSet(job, "window_steps")) r.window_steps = defaults.window_steps;
  if (!StragglerFieldSet(job, "min_gain")) r.min_gain = defaults.min_gain;
  if (!StragglerFieldSet(job, "probation_s")) r.probation_s = defaults.probation_s;
  if (!StragglerFieldSet(job, "recovered_above")) r.recovered_above = defaults.recovered_above;
  return r;
}

absl::Status ValidateStragglers(const StragglerSpec& s, const std::string& what, bool require_all) {
  for (const char* key : kStragglerKeys) {
    if (require_all || StragglerFieldSet(s, key)) {
      RETURN_IF_ERROR(CheckStragglerField(s, what, key));
    }
  }
  if (StragglerFieldSet(s, "slow_below") && StragglerFieldSet(s, "recovered_above") &&
      !(s.recovered_above > s.slow_below)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".recovered_above (", s.recovered_above,
                                                   ") must be greater than ", what, ".slow_below (",
                                                   s.slow_below, ")"));
  }
  return absl::OkStatus();
}

bool IsValidEnvKey(absl::string_view key) {
  if (key.empty() || key.size() > 256 || absl::ascii_isdigit(key[0])) return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

namespace {

// eval: held-out data of the same form as data, how often, how many samples.
absl::Status ValidateEval(const EvalSpec& eval, int64_t vocab) {
  if (!eval.enabled) return absl::OkStatus();
  if (eval.data.kind == "text" && eval.data.path.empty() && eval.data.sources.empty()) {
    return Bad("eval.data", "is required: the held-out data, in the same form as data");
  }
  RETURN_IF_ERROR(ValidateDataSpec(eval.data, vocab, "eval.data"));
  if (eval.data.kind == "text" && vocab < 256) {
    return Bad("model.vocab",
               absl::StrCat("is ", vocab, " but eval.data is text (bytes) and needs vocab >= 256"));
  }
  if (!eval.data.sample_log.empty()) {
    return Bad("eval.data.sample_log", "is for the training data (data.sample_log)");
  }
  RETURN_IF_ERROR(InRange("eval.every_steps", eval.every_steps, 0, kMaxSteps));
  return InRange("eval.samples", eval.samples, 0, kMaxEvalSamples);
}

// A masked LM needs its [MASK] id: given, or in the tokenizer directory (checked with the
// files: ResolveMaskToken).
absl::Status ValidateMaskSource(const ModelSpec& model, const DataSpec& data) {
  if (!IsMaskedLm(model.kind) || model.mask_token >= 0 || !data.tokenizer_dir.empty()) {
    return absl::OkStatus();
  }
  return Bad("model.mask_token_id",
             "is required for model.kind bert without data.tokenizer_dir (whose tokenizer.json "
             "names the [MASK] token)");
}

}  // namespace

// Note [Limits]: every number has a range a real job could use (docs/job_spec.md "Limits"),
// so a typo or a hostile spec is refused at submit instead of exhausting memory, overflowing
// an int32 on the wire, or running with an infinite timeout.
absl::Status JobSpec::Validate() const {
  if (name.empty()) return Bad("name", "must not be empty");
  if (name.size() > 128) return Bad("name", "must be at most 128 characters");
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return Bad("name", "must not hold control characters (it is shown in terminals)");
    }
  }
  if (priority.empty() || priority.size() > 32 ||
      !std::all_of(priority.begin(), priority.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
      })) {
    return Bad("priority",
               "must be a class name (high, normal, low, or one the manager config "
               "adds): 1-32 of a-z, 0-9, _ and -");
  }
  RETURN_IF_ERROR(ValidateModel(model));
  RETURN_IF_ERROR(ValidateDataSpec(data, model.vocab, "data"));
  if (data.kind == "text" && model.vocab < 256) {
    return Bad("model.vocab",
               absl::StrCat("is ", model.vocab, " but text data is bytes and needs vocab >= 256"));
  }
  RETURN_IF_ERROR(ValidateEval(eval, model.vocab));
  RETURN_IF_ERROR(ValidateMaskSource(model, data));
  if (observability.tensorboard_dir.size() > 4096) {
    return Bad("observability.tensorboard_dir", "is longer than 4096 characters");
  }
  RETURN_IF_ERROR(InRange("train.global_batch", train.global_batch, 1, kMaxGlobalBatch));
  RETURN_IF_ERROR(InRange("train.steps", train.steps, 0, kMaxSteps));
  RETURN_IF_ERROR(OneOf("train.optimizer", train.optimizer, {"adamw", "sgd"}));
  // lr 0 is a run that changes no weight (evaluate, or convert: docs/models.md).
  RETURN_IF_ERROR(Finite("train.lr", train.lr, 0, 100, /*open_low=*/false));
  if (!(train.min_lr >= 0 && train.min_lr <= train.lr)) {
    return Bad("train.min_lr", "must be in [0, lr]");
  }
  RETURN_IF_ERROR(InRange("train.warmup", train.warmup, 0, kMaxSteps));
  RETURN_IF_ERROR(OneOf("train.schedule", train.schedule, {"cosine", "linear", "constant"}));
  RETURN_IF_ERROR(Finite("train.clip_grad_norm", train.clip_grad_norm, 0, 1e6));
  RETURN_IF_ERROR(Finite("train.weight_decay", train.weight_decay, 0, 100));
  if (!(train.beta1 >= 0 && train.beta1 < 1)) return Bad("train.beta1", "must be in [0, 1)");
  if (!(train.beta2 >= 0 && train.beta2 < 1)) return Bad("train.beta2", "must be in [0, 1)");
  if (!(train.momentum >= 0 && train.momentum < 1)) {
    return Bad("train.momentum", "must be in [0, 1)");
  }
  RETURN_IF_ERROR(OneOf("train.precision", train.precision, {"fp32", "bf16", "fp16"}));
  {
    int index = 0;
    const std::string& d = train.device;
    const bool numbered = d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() <= 8 &&
                          absl::SimpleAtoi(d.substr(5), &index) && index >= 0;
    if (d != "auto" && d != "cpu" && d != "cuda" && !numbered) {
      return Bad("train.device", "must be auto, cpu, cuda or cuda:N");
    }
  }
  RETURN_IF_ERROR(Finite("train.init_loss_scale", train.init_loss_scale, 1, 3.4e38));  // FLT_MAX
  RETURN_IF_ERROR(InRange("train.loss_scale_window", train.loss_scale_window, 1, kMaxSteps));
  if (parallel.stages != 0)
    RETURN_IF_ERROR(InRange("parallel.stages", parallel.stages, 1, kMaxLayers));
  if (parallel.micro_batch != 0) {
    RETURN_IF_ERROR(InRange("parallel.micro_batch", parallel.micro_batch, 1, kMaxGlobalBatch));
    if (parallel.micro_batch > train.global_batch) {
      return Bad("parallel.micro_batch",
                 absl::StrCat("(", parallel.micro_batch, ") is larger than train.global_batch (",
                              train.global_batch, ")"));
    }
  }
  if (parallel.replicas != 0) {
    RETURN_IF_ERROR(InRange("parallel.replicas", parallel.replicas, 1, kMaxSlots));
  }
  RETURN_IF_ERROR(
      OneOf("parallel.schedule", parallel.schedule, {"varuna", "gpipe", "1f1b", "zb-h1", "auto"}));
  if (parallel.tp_size != 0) {  // 0: auto (AutoConfig picks; 1 without a plan)
    RETURN_IF_ERROR(InRange("parallel.tp_size", parallel.tp_size, 1, kMaxTensorParallel));
  }
  if (parallel.tp_size > 1) RETURN_IF_ERROR(CheckTensorParallel(model, parallel.tp_size));
  if (parallel.tp_size > 1 && !model.init_from.empty()) {
    return Bad("model.init_from",
               absl::StrCat("cannot be used with parallel.tp_size = ", parallel.tp_size,
                            ": the Hugging Face tensors load unsplit; start with tp_size 1 and "
                            "resume its checkpoint at any tp_size"));
  }
  RETURN_IF_ERROR(ValidatePipelines());
  RETURN_IF_ERROR(Finite("parallel.timeout_s", parallel.timeout_s, 0, 86400, /*open_low=*/true));
  RETURN_IF_ERROR(InRange("checkpoint.every_steps", checkpoint.every_steps, 0, kMaxSteps));
  RETURN_IF_ERROR(InRange("checkpoint.keep", checkpoint.keep, 0, 100000));
  if (!checkpoint.resume.empty()) {
    if (auto step = ParseResumeStep(checkpoint.resume); !step.ok()) {
      return Bad("checkpoint.resume", std::string(step.status().message()));
    }
    if (checkpoint.dir.empty()) return Bad("checkpoint.resume", "needs checkpoint.dir");
  }
  RETURN_IF_ERROR(InRange("resources.min_slots", resources.min_slots, 1, kMaxSlots));
  RETURN_IF_ERROR(InRange("resources.max_slots", resources.max_slots, 0, kMaxSlots));
  RETURN_IF_ERROR(Finite("resources.max_wait_s", resources.max_wait_s, 0, 365.0 * 86400));
  if (!code_dir.empty() && (code_dir[0] != '/' || code_dir.find('\0') != std::string::npos)) {
    return Bad("code_dir", "must be an absolute path");
  }
  if (resources.max_slots != 0 && resources.max_slots < resources.min_slots) {
    return Bad("resources.max_slots", "must be >= resources.min_slots (or 0 for no limit)");
  }
  if (absl::Status st = ValidateStragglers(stragglers, "stragglers", false); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", st.message()));
  }
  for (size_t i = 0; i < entrypoint.size(); ++i) {
    if (entrypoint[i].find('\0') != std::string::npos || (i == 0 && entrypoint[i].empty())) {
      return Bad(absl::StrCat("entrypoint[", i, "]"), "must be a non-empty word without NUL");
    }
  }
  if (env.size() > kMaxEnvEntries) {
    return Bad("env", absl::StrCat("has ", env.size(), " entries; the limit is ", kMaxEnvEntries));
  }
  for (const auto& [k, v] : env) {
    if (!IsValidEnvKey(k)) {
      return Bad(absl::StrCat("env.", k), "is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)");
    }
    if (v.find('\0') != std::string::npos) return Bad(absl::StrCat("env.", k), "contains NUL");
  }
  return absl::OkStatus();
}

absl::Status JobSpec::ValidatePipelines() const {
  const auto& pipes = parallel.pipelines;
  if (pipes.empty()) return absl::OkStatus();
  if (parallel.stages != 0 || parallel.replicas != 0) {
    return Bad("parallel.pipelines",
               "replaces parallel.stages and parallel.replicas; set one or the other, not both");
  }
  if (parallel.micro_batch == 0) {
    return Bad("parallel.micro_batch",
               "must be set with parallel.pipelines (it is the micro-batch size of every "
               "pipeline)");
  }
  int64_t microbatches = 0;
  for (size_t i = 0; i < pipes.size(); ++i) {
    const std::string key = absl::StrCat("parallel.pipelines[", i, "]");
    const PipelineEntrySpec& e = pipes[i];
    RETURN_IF_ERROR(InRange(key + ".count", e.count, 1, kMaxSlots));
    if (e.microbatches == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec: All pipelines must have a corresponding number of "
                       "microbatches. (",
                       key, ".microbatches is missing)"));
    }
    RETURN_IF_ERROR(InRange(key + ".microbatches", e.microbatches, 1, kMaxGlobalBatch));
    for (size_t j = 0; j < e.stages.size(); ++j) {
      if (e.stages[j].empty()) return Bad(absl::StrCat(key, ".stages[", j, "]"), "is empty");
    }
    for (size_t k = 0; k < i; ++k) {
      if (pipes[k].stages == e.stages && pipes[k].microbatches != e.microbatches) {
        return Bad(key,
                   absl::StrCat("has the same template as parallel.pipelines[", k, "] but ",
                                e.microbatches, " microbatches instead of ", pipes[k].microbatches,
                                ": identical templates must have the same number of "
                                "microbatches"));
      }
    }
    microbatches += static_cast<int64_t>(e.count) * e.microbatches;
    if (microbatches > kMaxGlobalBatch) {
      return Bad("parallel.pipelines",
                 absl::StrCat("add up to more than ", kMaxGlobalBatch, " micro-batches per step"));
    }
  }
  if (microbatches * parallel.micro_batch != train.global_batch) {
    return Bad("train.global_batch",
               absl::StrCat("is ", train.global_batch,
                            ", inconsistent with the pipelines: parallel.micro_batch (",
                            parallel.micro_batch, ") x their microbatches (", microbatches,
                            ") = ", microbatches * parallel.micro_batch));
  }
  return absl::OkStatus();
}

absl::Status JobSpec::ValidateShape() const {
  // resources.* count processes: tp_size of them per position (a fixed size; auto may be 1).
  const int tp = std::max(1, parallel.tp_size);
  if (resources.max_slots > 0 && resources.max_slots < tp) {
    return Bad("resources.max_slots",
               absl::StrCat("is ", resources.max_slots, " but parallel.tp_size = ", tp,
                            " needs that many slots for each stage"));
  }
  if (!parallel.pipelines.empty()) {
    const int ranks = PipelineRanks(parallel) * tp;
    if (ranks < resources.min_slots) {
      return Bad("resources.min_slots",
                 absl::StrCat("is ", resources.min_slots, " but parallel.pipelines uses ", ranks));
    }
    if (resources.max_slots != 0 && ranks > resources.max_slots) {
      return Bad("resources.max_slots",
                 absl::StrCat("is ", resources.max_slots, " but parallel.pipelines needs ", ranks));
    }
    if (model.kind != "torchscript") {  // TorchScript modules are checked by the worker
      ASSIGN_OR_RETURN(std::vector<std::string> modules, BuiltinModules(model));
      auto topo = TopologyFromSpec(*this, modules);
      if (!topo.ok()) {
        return absl::Status(topo.status().code(),
                            absl::StrCat("job spec: ", topo.status().message()));
      }
    }
  }
  if (parallel.replicas > 0 && train.global_batch % parallel.replicas != 0) {
    return Bad("train.global_batch",
               absl::StrCat("(", train.global_batch, ") is not divisible by parallel.replicas (",
                            parallel.replicas, ")"));
  }
  if (parallel.replicas > 0 && parallel.micro_batch > train.global_batch / parallel.replicas) {
    return Bad("parallel.micro_batch",
               absl::StrCat("(", parallel.micro_batch, ") is larger than the per-replica batch (",
                            train.global_batch / parallel.replicas,
                            " = train.global_batch / parallel.replicas)"));
  }
  if (parallel.stages > 0 && parallel.replicas > 0) {
    const int64_t world = static_cast<int64_t>(parallel.stages) * parallel.replicas * tp;
    if (world < resources.min_slots) {
      return Bad("resources.min_slots",
                 absl::StrCat("is ", resources.min_slots, " but parallel.stages x replicas",
                              tp > 1 ? " x tp_size" : "", " uses ", world, " slots"));
    }
  }
  const int64_t fixed_world =
      static_cast<int64_t>(std::max(parallel.stages, 1)) * std::max(parallel.replicas, 1) * tp;
  if (resources.max_slots > 0 && fixed_world > resources.max_slots) {
    return Bad("resources.max_slots",
               absl::StrCat("is ", resources.max_slots, " but parallel.stages x replicas",
                            tp > 1 ? " x tp_size" : "", " needs at least ", fixed_world, " slots"));
  }
  return absl::OkStatus();
}

absl::Status JobSpec::ValidateFiles() const {
  RETURN_IF_ERROR(ValidateDataFiles(data, model.vocab, "data"));
  if (eval.enabled) RETURN_IF_ERROR(ValidateDataFiles(eval.data, model.vocab, "eval.data"));
  if (IsMaskedLm(model.kind)) {
    ModelSpec resolved = model;  // the tokenizer names the mask token
    RETURN_IF_ERROR(ResolveMaskToken(&resolved, data.tokenizer_dir));
  }
  if (!env_file.empty()) RETURN_IF_ERROR(CheckRegularFile(env_file, "env_file"));
  if (model.kind == "torchscript") {
    RETURN_IF_ERROR(CheckRegularFile(model.path + "/segment_0.pt", "model.path segment_0.pt"));
  }
  if (!model.init_from.empty()) {
    std::vector<std::string> missing;
    for (const auto& [key, value] : ArchitectureKeys(model)) {
      if (!model.given.count(key)) missing.push_back(key);
    }
    if (!missing.empty()) {
      return Bad("model.init_from",
                 absl::StrCat("needs the architecture in the job spec (varunactl submit and "
                              "varuna-worker fill it in from config.json); missing: ",
                              absl::StrJoin(missing, ", ")));
    }
    ModelSpec resolved = model;
    RETURN_IF_ERROR(ResolveInitFrom(&resolved));
  }
  return absl::OkStatus();
}

namespace {

// Reads "auto" as 0, otherwise a positive integer.
std::function<absl::Status(const YAML::Node&)> AutoInt(const std::string& key, int* out) {
  return [key, out](const YAML::Node& v) -> absl::Status {
    if (v.IsScalar() && v.Scalar() == "auto") {
      *out = 0;
      return absl::OkStatus();
    }
    auto n = YamlAs<int>(v, "job spec", key);
    if (!n.ok()) {
      return Bad(key, absl::StrCat("must be an integer or 'auto', got '", Describe(v), "'"));
    }
    *out = *n;
    if (*out < 1) return Bad(key, "must be >= 1 or 'auto'");
    return absl::OkStatus();
  };
}

// stragglers: each key given is read and checked as set (CheckStragglerField), so a value
// equal to the "unset" marker is refused instead of silently taking the manager's default.
void StragglerKeys(MapReader& r, StragglerSpec* out) {
  auto key = [&r, out](const std::string& k, auto* field) {
    r.Sub(k, [out, k, field](const YAML::Node& v) -> absl::Status {
      RETURN_IF_ERROR(ReadInto(v, "job spec", absl::StrCat("stragglers.", k), field));
      absl::Status st = CheckStragglerField(*out, "stragglers", k);
      if (st.ok()) return st;
      return absl::InvalidArgumentError(absl::StrCat("job spec: ", st.message()));
    });
  };
  key("policy", &out->policy);
  key("slow_below", &out->slow_below);
  key("window_steps", &out->window_steps);
  key("min_gain", &out->min_gain);
  key("probation_s", &out->probation_s);
  key("recovered_above", &out->recovered_above);
}

// parallel.pipelines: a list of {stages: [[module, ...], ...], count, microbatches}.
absl::Status ReadPipelines(const YAML::Node& v, std::vector<PipelineEntrySpec>* out) {
  if (!v.IsSequence()) return Bad("parallel.pipelines", "must be a list of pipelines");
  if (v.size() > static_cast<size_t>(kMaxLayers)) {
    return Bad("parallel.pipelines", absl::StrCat("has more than ", kMaxLayers, " entries"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string key = absl::StrCat("parallel.pipelines[", i, "]");
    PipelineEntrySpec e;
    MapReader r(v[i], key);
    r.Sub("stages",
          [&](const YAML::Node& s) -> absl::Status {
            if (!s.IsSequence() || s.size() == 0) {
              return Bad(key + ".stages", "must be a non-empty list of stages (lists of modules)");
            }
            for (size_t j = 0; j < s.size(); ++j) {
              const std::string sk = absl::StrCat(key, ".stages[", j, "]");
              if (!s[j].IsSequence()) return Bad(sk, "must be a list of module names");
              std::vector<std::string> stage;
              for (size_t m = 0; m < s[j].size(); ++m) {
                ASSIGN_OR_RETURN(std::string name,
                                 YamlScalar(s[j][m], "job spec", absl::StrCat(sk, "[", m, "]")));
                stage.push_back(std::move(name));
              }
              e.stages.push_back(std::move(stage));
            }
            return absl::OkStatus();
          })
        .Field("count", &e.count)
        .Field("microbatches", &e.microbatches);
    if (!v[i].IsMap()) return Bad(key, "must be a mapping {stages, count, microbatches}");
    RETURN_IF_ERROR(r.Read());
    if (e.stages.empty()) return Bad(key + ".stages", "is missing");
    out->push_back(std::move(e));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {
absl::StatusOr<JobSpec> ParseJobSpecUnguarded(const std::string& yaml_text) {
  if (yaml_text.size() > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", yaml_text.size(), " bytes; the limit is ", kMaxJobSpecBytes));
  }
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml_text, "job spec"));
  if (!root || root.IsNull()) return absl::InvalidArgumentError("job spec: empty document");
  JobSpec spec;
  auto section = [](const std::string& name, auto fill) {
    return [name, fill](const YAML::Node& v) -> absl::Status {
      MapReader r(v, name);
      fill(r);
      return r.Read();
    };
  };
  MapReader top(root, "");
  top.Field("name", &spec.name)
      .Sub("model", section("model",
                            [&](MapReader& r) {
                              for (const std::string& key : ModelKeys()) {
                                r.Sub(key, [&spec, key](const YAML::Node& v) -> absl::Status {
                                  ASSIGN_OR_RETURN(std::string text,
                                                   YamlScalar(v, "job spec", "model." + key));
                                  return SetModelKey(key, text, &spec.model);
                                });
                              }
                            }))
      .Sub("data", [&spec](const YAML::Node& v) { return ReadDataSpec(v, "data", &spec.data); })
      .Sub("eval", section("eval",
                           [&](MapReader& r) {
                             spec.eval.enabled = true;
                             r.Sub("data",
                                   [&spec](const YAML::Node& v) {
                                     return ReadDataSpec(v, "eval.data", &spec.eval.data);
                                   })
                                 .Field("every_steps", &spec.eval.every_steps)
                                 .Field("samples", &spec.eval.samples);
                           }))
      .Sub("observability", section("observability",
                                    [&](MapReader& r) {
                                      r.Field("tensorboard_dir",
                                              &spec.observability.tensorboard_dir);
                                    }))
      .Sub("train", section("train",
                            [&](MapReader& r) {
                              TrainSpec& t = spec.train;
                              r.Field("global_batch", &t.global_batch)
                                  .Field("steps", &t.steps)
                                  .Field("optimizer", &t.optimizer)
                                  .Field("lr", &t.lr)
                                  .Field("min_lr", &t.min_lr)
                                  .Field("warmup", &t.warmup)
                                  .Field("schedule", &t.schedule)
                                  .Field("clip_grad_norm", &t.clip_grad_norm)
                                  .Field("weight_decay", &t.weight_decay)
                                  .Field("beta1", &t.beta1)
                                  .Field("beta2", &t.beta2)
                                  .Field("momentum", &t.momentum)
                                  .Field("precision", &t.precision)
                                  .Field("device", &t.device)
                                  .Field("init_loss_scale", &t.init_loss_scale)
                                  .Field("loss_scale_window", &t.loss_scale_window)
                                  .Field("seed", &t.seed);
                            }))
      .Sub("parallel",
           section("parallel",
                   [&](MapReader& r) {
                     r.Sub("stages", AutoInt("parallel.stages", &spec.parallel.stages))
                         .Sub("micro_batch",
                              AutoInt("parallel.micro_batch", &spec.parallel.micro_batch))
                         .Sub("replicas", AutoInt("parallel.replicas", &spec.parallel.replicas))
                         .Field("schedule", &spec.parallel.schedule)
                         .Sub("tp_size", AutoInt("parallel.tp_size", &spec.parallel.tp_size))
                         .Field("timeout_s", &spec.parallel.timeout_s)
                         .Sub("pipelines", [&](const YAML::Node& v) {
                           return ReadPipelines(v, &spec.parallel.pipelines);
                         });
                   }))
      .Sub("checkpoint", section("checkpoint",
                                 [&](MapReader& r) {
                                   r.Field("dir", &spec.checkpoint.dir)
                                       .Field("every_steps", &spec.checkpoint.every_steps)
                                       .Field("keep", &spec.checkpoint.keep)
                                       .Field("tempdir", &spec.checkpoint.tempdir)
                                       .Field("shard", &spec.checkpoint.shard)
                                       .Field("commit", &spec.checkpoint.commit)
                                       .Field("resume", &spec.checkpoint.resume);
                                 }))
      .Sub("resources", section("resources",
                                [&](MapReader& r) {
                                  r.Field("min_slots", &spec.resources.min_slots)
                                      .Field("max_slots", &spec.resources.max_slots)
                                      .Field("max_wait_s", &spec.resources.max_wait_s);
                                }))
      .Sub("stragglers",
           section("stragglers", [&](MapReader& r) { StragglerKeys(r, &spec.stragglers); }))
      .Field("entrypoint", &spec.entrypoint)
      .Field("code_dir", &spec.code_dir)
      .Field("morphing", &spec.morphing)
      .Field("priority", &spec.priority)
      .Sub("env", [&](const YAML::Node& v) { return ReadEnv(v, &spec.env); })
      .Field("env_file", &spec.env_file);
  RETURN_IF_ERROR(top.Read());
  FillModelDefaults(&spec.model);
  RETURN_IF_ERROR(spec.Validate());
  return spec;
}
}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text) {
  // Note [Parser boundary] (common/spec/submission.cc): the backstop for anything yaml-cpp throws.
  try {
    return ParseJobSpecUnguarded(yaml_text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: cannot be read: ", e.what()));
  }
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kMaxJobSpecBytes, "job file"));
  auto spec = ParseJobSpec(text);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace varuna

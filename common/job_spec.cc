#include "common/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_store.h"
#include "common/status_macros.h"

namespace varuna {
namespace {

absl::Status Bad(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: '", key, "' ", what));
}

// Walks one YAML mapping, dispatching each key to a field reader; unknown keys are errors.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string prefix) : node_(node), prefix_(std::move(prefix)) {}

  template <typename T>
  MapReader& Field(const std::string& key, T* out) {
    readers_[key] = [this, key, out](const YAML::Node& v) -> absl::Status {
      try {
        *out = v.as<T>();
      } catch (const YAML::Exception&) {
        return Bad(Path(key), absl::StrCat("has an invalid value '", Scalar(v), "'"));
      }
      return absl::OkStatus();
    };
    return *this;
  }
  MapReader& Sub(const std::string& key, std::function<absl::Status(const YAML::Node&)> fn) {
    readers_[key] = std::move(fn);
    return *this;
  }

  absl::Status Read() {
    if (!node_ || node_.IsNull()) return absl::OkStatus();
    if (!node_.IsMap()) return Bad(prefix_.empty() ? "<root>" : prefix_, "must be a mapping");
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      auto it = readers_.find(key);
      if (it == readers_.end()) {
        std::vector<std::string> known;
        for (const auto& [k, _] : readers_) known.push_back(k);
        return absl::InvalidArgumentError(absl::StrCat(
            "job spec: unknown key '", Path(key), "' (known: ", absl::StrJoin(known, ", "), ")"));
      }
      RETURN_IF_ERROR(it->second(kv.second));
    }
    return absl::OkStatus();
  }

  std::string Path(const std::string& key) const {
    return prefix_.empty() ? key : absl::StrCat(prefix_, ".", key);
  }

 private:
  static std::string Scalar(const YAML::Node& v) {
    if (v.IsScalar()) return v.Scalar();
    std::stringstream ss;
    ss << v;
    return ss.str();
  }
  const YAML::Node& node_;
  std::string prefix_;
  std::map<std::string, std::function<absl::Status(const YAML::Node&)>> readers_;
};

absl::Status OneOf(const std::string& key, const std::string& value,
                   const std::set<std::string>& allowed) {
  if (allowed.count(value)) return absl::OkStatus();
  return Bad(key,
             absl::StrCat("is '", value, "'; expected one of: ", absl::StrJoin(allowed, ", ")));
}

}  // namespace

absl::Status JobSpec::Validate() const {
  if (name.empty()) return Bad("name", "must not be empty");
  RETURN_IF_ERROR(OneOf("model.kind", model.kind, {"gpt", "mlp", "torchscript"}));
  if (model.layers < 1) return Bad("model.layers", "must be >= 1");
  if (model.d_model < 1) return Bad("model.d_model", "must be >= 1");
  if (model.heads < 1) return Bad("model.heads", "must be >= 1");
  if (model.kind == "gpt" && model.d_model % model.heads != 0) {
    return Bad("model.heads",
               absl::StrCat("(", model.heads, ") must divide model.d_model (", model.d_model, ")"));
  }
  if (model.seq_len < 1) return Bad("model.seq_len", "must be >= 1");
  if (model.vocab < 2) return Bad("model.vocab", "must be >= 2");
  if (model.dropout < 0 || model.dropout >= 1) return Bad("model.dropout", "must be in [0, 1)");
  if (model.kind == "torchscript" && model.path.empty()) {
    return Bad("model.path", "is required for model.kind torchscript");
  }
  RETURN_IF_ERROR(OneOf("data.kind", data.kind, {"text", "tokens"}));
  if (data.path.empty()) return Bad("data.path", "is required");
  RETURN_IF_ERROR(OneOf("data.dtype", data.dtype, {"uint16", "uint32"}));
  if (data.kind == "text" && model.vocab < 256) {
    return Bad("model.vocab",
               absl::StrCat("is ", model.vocab, " but text data is bytes and needs vocab >= 256"));
  }
  if (train.global_batch < 1) return Bad("train.global_batch", "must be >= 1");
  if (train.steps < 0) return Bad("train.steps", "must be >= 0");
  RETURN_IF_ERROR(OneOf("train.optimizer", train.optimizer, {"adamw", "sgd"}));
  if (!(train.lr > 0)) return Bad("train.lr", "must be > 0");
  if (train.min_lr < 0 || train.min_lr > train.lr) return Bad("train.min_lr", "must be in [0, lr]");
  if (train.warmup < 0) return Bad("train.warmup", "must be >= 0");
  RETURN_IF_ERROR(OneOf("train.schedule", train.schedule, {"cosine", "linear", "constant"}));
  if (train.clip_grad_norm < 0) return Bad("train.clip_grad_norm", "must be >= 0 (0 = off)");
  if (train.weight_decay < 0) return Bad("train.weight_decay", "must be >= 0");
  if (train.beta1 < 0 || train.beta1 >= 1) return Bad("train.beta1", "must be in [0, 1)");
  if (train.beta2 < 0 || train.beta2 >= 1) return Bad("train.beta2", "must be in [0, 1)");
  if (train.momentum < 0 || train.momentum >= 1) return Bad("train.momentum", "must be in [0, 1)");
  RETURN_IF_ERROR(OneOf("train.precision", train.precision, {"fp32", "bf16", "fp16"}));
  if (!(train.init_loss_scale >= 1)) return Bad("train.init_loss_scale", "must be >= 1");
  if (train.loss_scale_window < 1) return Bad("train.loss_scale_window", "must be >= 1");
  if (parallel.stages < 0) return Bad("parallel.stages", "must be >= 1 or 'auto'");
  if (parallel.micro_batch < 0) return Bad("parallel.micro_batch", "must be >= 1 or 'auto'");
  if (parallel.replicas < 0) return Bad("parallel.replicas", "must be >= 1 or 'auto'");
  RETURN_IF_ERROR(OneOf("parallel.schedule", parallel.schedule, {"varuna", "gpipe", "1f1b"}));
  if (!(parallel.timeout_s > 0)) return Bad("parallel.timeout_s", "must be > 0");
  if (checkpoint.every_steps < 0) return Bad("checkpoint.every_steps", "must be >= 0");
  if (checkpoint.keep < 0) return Bad("checkpoint.keep", "must be >= 0");
  if (!checkpoint.resume.empty()) {
    if (auto step = ParseResumeStep(checkpoint.resume); !step.ok()) {
      return Bad("checkpoint.resume", std::string(step.status().message()));
    }
    if (checkpoint.dir.empty()) return Bad("checkpoint.resume", "needs checkpoint.dir");
  }
  if (resources.min_slots < 1) return Bad("resources.min_slots", "must be >= 1");
  if (resources.max_slots != 0 && resources.max_slots < resources.min_slots) {
    return Bad("resources.max_slots", "must be >= resources.min_slots (or 0 for no limit)");
  }
  return absl::OkStatus();
}

absl::Status JobSpec::ValidateShape() const {
  if (parallel.replicas > 0 && train.global_batch % parallel.replicas != 0) {
    return Bad("train.global_batch",
               absl::StrCat("(", train.global_batch, ") is not divisible by parallel.replicas (",
                            parallel.replicas, ")"));
  }
  if (parallel.stages > 0 && parallel.replicas > 0) {
    const int64_t world = static_cast<int64_t>(parallel.stages) * parallel.replicas;
    if (world < resources.min_slots) {
      return Bad("resources.min_slots",
                 absl::StrCat("is ", resources.min_slots, " but parallel.stages x replicas uses ",
                              world, " slots"));
    }
  }
  const int64_t fixed_world =
      static_cast<int64_t>(std::max(parallel.stages, 1)) * std::max(parallel.replicas, 1);
  if (resources.max_slots > 0 && fixed_world > resources.max_slots) {
    return Bad(
        "resources.max_slots",
        absl::StrCat("is ", resources.max_slots, " but parallel.stages x replicas needs at least ",
                     fixed_world, " slots"));
  }
  return absl::OkStatus();
}

absl::Status JobSpec::ValidateFiles() const {
  std::ifstream f(data.path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("data.path '", data.path, "' cannot be read"));
  if (!env_file.empty()) {
    std::ifstream e(env_file);
    if (!e) return absl::NotFoundError(absl::StrCat("env_file '", env_file, "' cannot be read"));
  }
  if (model.kind == "torchscript") {
    std::ifstream s(model.path + "/segment_0.pt", std::ios::binary);
    if (!s) {
      return absl::NotFoundError(
          absl::StrCat("model.path '", model.path, "' has no readable segment_0.pt"));
    }
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
    try {
      *out = v.as<int>();
    } catch (const YAML::Exception&) {
      return Bad(key, absl::StrCat("must be an integer or 'auto', got '",
                                   v.IsScalar() ? v.Scalar() : "<non-scalar>", "'"));
    }
    if (*out < 1) return Bad(key, "must be >= 1 or 'auto'");
    return absl::OkStatus();
  };
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: malformed YAML: ", e.what()));
  }
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
                              r.Field("kind", &spec.model.kind)
                                  .Field("layers", &spec.model.layers)
                                  .Field("d_model", &spec.model.d_model)
                                  .Field("heads", &spec.model.heads)
                                  .Field("seq_len", &spec.model.seq_len)
                                  .Field("vocab", &spec.model.vocab)
                                  .Field("dropout", &spec.model.dropout)
                                  .Field("path", &spec.model.path);
                            }))
      .Sub("data", section("data",
                           [&](MapReader& r) {
                             r.Field("kind", &spec.data.kind)
                                 .Field("path", &spec.data.path)
                                 .Field("dtype", &spec.data.dtype);
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
                         .Field("timeout_s", &spec.parallel.timeout_s);
                   }))
      .Sub("checkpoint", section("checkpoint",
                                 [&](MapReader& r) {
                                   r.Field("dir", &spec.checkpoint.dir)
                                       .Field("every_steps", &spec.checkpoint.every_steps)
                                       .Field("keep", &spec.checkpoint.keep)
                                       .Field("tempdir", &spec.checkpoint.tempdir)
                                       .Field("shard", &spec.checkpoint.shard)
                                       .Field("resume", &spec.checkpoint.resume);
                                 }))
      .Sub("resources", section("resources",
                                [&](MapReader& r) {
                                  r.Field("min_slots", &spec.resources.min_slots)
                                      .Field("max_slots", &spec.resources.max_slots);
                                }))
      .Field("entrypoint", &spec.entrypoint)
      .Field("env", &spec.env)
      .Field("env_file", &spec.env_file);
  RETURN_IF_ERROR(top.Read());
  RETURN_IF_ERROR(spec.Validate());
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("job file '", path, "' cannot be read"));
  std::stringstream ss;
  ss << f.rdbuf();
  auto spec = ParseJobSpec(ss.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace varuna

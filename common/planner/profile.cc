#include "common/planner/profile.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace varuna {
namespace {

// Built-in cost model constants (docs/autoconfig.md): one CPU core or a slow accelerator.
constexpr double kBuiltinFlops = 20e9;     // sustained FLOP/s of one slot
constexpr double kBuiltinLatency = 50e-6;  // one-way p2p latency, same host
constexpr double kBuiltinBandwidth = 2e9;  // bytes/s, same host
constexpr double kBuiltinCrossLatency = 150e-6;
constexpr double kBuiltinCrossBandwidth = 1.25e9;  // 10 Gb/s
constexpr double kBytesPerElem = 4;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("profile: ", field, " ", what));
}

absl::Status CheckNumber(const std::string& field, double v) {
  if (!std::isfinite(v) || v < 0)
    return Bad(field, absl::StrCat("= ", v, " must be finite and >= 0"));
  return absl::OkStatus();
}

absl::Status CheckSamples(const std::string& field,
                          const google::protobuf::RepeatedPtrField<v1::TransferSample>& samples) {
  double prev = -1;
  for (int i = 0; i < samples.size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    RETURN_IF_ERROR(CheckNumber(f + ".bytes", samples[i].bytes()));
    RETURN_IF_ERROR(CheckNumber(f + ".seconds", samples[i].seconds()));
    if (samples[i].bytes() <= prev) return Bad(f + ".bytes", "must be ascending");
    prev = samples[i].bytes();
  }
  return absl::OkStatus();
}

// y at x by linear interpolation over (xs, ys), extrapolated from the end segments; >= 0.
double Interpolate(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (xs.empty()) return 0;
  if (xs.size() == 1) return xs[0] > 0 ? std::max(0.0, ys[0] * x / xs[0]) : ys[0];
  size_t hi = 1;
  while (hi + 1 < xs.size() && xs[hi] < x) ++hi;
  const size_t lo = hi - 1;
  const double span = xs[hi] - xs[lo];
  const double y = span > 0 ? ys[lo] + (ys[hi] - ys[lo]) * (x - xs[lo]) / span : ys[hi];
  return std::max(0.0, y);
}

double SampleTime(const google::protobuf::RepeatedPtrField<v1::TransferSample>& samples,
                  double bytes) {
  std::vector<double> xs, ys;
  for (const auto& s : samples) {
    xs.push_back(s.bytes());
    ys.push_back(s.seconds());
  }
  if (xs.size() == 1) return ys[0] * std::max(1.0, bytes / std::max(1.0, xs[0]));
  return Interpolate(xs, ys, bytes);
}

}  // namespace

std::string ModelKey(const ModelSpec& m) {
  if (m.kind == "torchscript") return absl::StrCat("torchscript path=", m.path);
  std::string key = absl::StrCat(m.kind, " layers=", m.layers, " d_model=", m.d_model);
  if (m.kind == "gpt") absl::StrAppend(&key, " heads=", m.heads);
  if (IsHfKind(m.kind)) {
    absl::StrAppend(&key, " heads=", m.heads, " kv_heads=", m.kv_heads, " ffn=", m.ffn);
  }
  absl::StrAppend(&key, " seq_len=", m.seq_len, " vocab=", m.vocab);
  return key;
}

absl::StatusOr<std::vector<SegmentShape>> DescribeModel(const ModelSpec& m) {
  const double d = m.d_model, t = m.seq_len, v = m.vocab, h = m.heads;
  std::vector<SegmentShape> out;
  if (m.kind == "gpt") {
    // The same FLOP counts as worker/models/gpt.cc uses to balance stages.
    out.push_back({"embed", t * d, v * d + t * d, t * d, 2 * t * d});
    for (int i = 0; i < m.layers; ++i) {
      out.push_back({absl::StrCat("blocks.", i), 24 * t * d * d + 4 * t * t * d,
                     12 * d * d + 13 * d, t * d, 34 * t * d + 5 * h * t * t});
    }
    out.push_back({"head", 2 * t * d * v, v * d + 2 * d, 1, 3 * t * v + 2 * t * d});
  } else if (m.kind == "mlp") {
    out.push_back({"embed", t * d, v * d, t * d, t * d});
    for (int i = 0; i < m.layers; ++i) {
      out.push_back(
          {absl::StrCat("blocks.", i), 16 * t * d * d, 8 * d * d + 7 * d, t * d, 11 * t * d});
    }
    out.push_back({"head", 2 * t * d * v, v * d + v, 1, 3 * t * v});
  } else if (m.kind == "llama") {
    // Projections q,o: d x d; k,v: d x kv*hd; SwiGLU: 3 x d x ffn; no biases.
    const double kv = static_cast<double>(m.kv_heads) * (m.d_model / m.heads), f = m.ffn;
    const double params = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d;
    out.push_back({"model.embed_tokens", t * d, v * d, t * d, t * d});
    for (int i = 0; i < m.layers; ++i) {
      out.push_back({absl::StrCat("model.layers.", i), 2 * t * (params - 2 * d) + 4 * t * t * d,
                     params, t * d, 18 * t * d + 4 * t * f + 5 * h * t * t});
    }
    out.push_back({"model.norm,lm_head", 2 * t * d * v, v * d + d, 1, 3 * t * v + 2 * t * d});
  } else if (m.kind == "gpt2") {
    const double f = m.ffn, pos = m.max_positions;
    const double params = 4 * d * d + 2 * d * f + 9 * d + f;
    out.push_back({"transformer.wte,transformer.wpe", t * d, v * d + pos * d, t * d, 2 * t * d});
    for (int i = 0; i < m.layers; ++i) {
      out.push_back({absl::StrCat("transformer.h.", i),
                     2 * t * (4 * d * d + 2 * d * f) + 4 * t * t * d, params, t * d,
                     18 * t * d + 4 * t * f + 5 * h * t * t});
    }
    out.push_back(
        {"transformer.ln_f,lm_head", 2 * t * d * v, v * d + 2 * d, 1, 3 * t * v + 2 * t * d});
  } else if (m.kind == "bert") {
    // The same FLOP counts as worker/models/bert.cc; the head's transform and decoder bias.
    const double f = m.ffn, pos = m.max_positions, types = m.type_vocab;
    const double params = 4 * d * d + 2 * d * f + 9 * d + f;
    out.push_back({"bert.embeddings", t * d, (v + pos + types) * d + 2 * d, t * d, 3 * t * d});
    for (int i = 0; i < m.layers; ++i) {
      out.push_back({absl::StrCat("bert.encoder.layer.", i),
                     2 * t * (4 * d * d + 2 * d * f) + 4 * t * t * d, params, t * d,
                     18 * t * d + 4 * t * f + 5 * h * t * t});
    }
    out.push_back({"cls.predictions", 2 * t * d * d + 2 * t * d * v, v * d + d * d + 3 * d + v, 1,
                   3 * t * v + 4 * t * d});
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.kind '", m.kind, "' has no built-in cost model; profile it (varunactl profile)"));
  }
  return out;
}

absl::StatusOr<v1::Profile> BuiltinProfile(const JobSpec& spec) {
  ASSIGN_OR_RETURN(std::vector<SegmentShape> shapes, DescribeModel(spec.model));
  v1::Profile p;
  p.set_version(kProfileVersion);
  p.set_model_key(ModelKey(spec.model));
  p.set_precision(spec.train.precision);
  p.set_device("builtin");
  p.set_host("built-in cost model");
  p.set_optimizer(spec.train.optimizer);
  const std::vector<int> sizes = {1, 64};
  for (int b : sizes) p.add_micro_batches(b);
  const double opt_factor = spec.train.optimizer == "adamw" ? 12 : 4;  // FLOPs per parameter
  for (size_t i = 0; i < shapes.size(); ++i) {
    const SegmentShape& s = shapes[i];
    auto* seg = p.add_segments();
    seg->set_index(static_cast<int>(i));
    seg->set_layers(s.layers);
    seg->set_param_bytes(s.params * kBytesPerElem);
    seg->set_optimizer_s(s.params * opt_factor / kBuiltinFlops);
    for (int b : sizes) {
      auto* c = seg->add_costs();
      const double f = 2 * s.flops_per_sample * b / kBuiltinFlops;  // multiply-add = 2 FLOPs
      c->set_micro_batch(b);
      c->set_forward_s(f);
      c->set_forward_nograd_s(f);
      c->set_recompute_s(f);
      c->set_backward_s(2 * f);
      c->set_weight_s(f);  // the weight gradients: one of the backward's two matmuls per linear
      c->set_activation_bytes(s.out_elems_per_sample * b * kBytesPerElem);
      c->set_graph_bytes(s.graph_elems_per_sample * b * kBytesPerElem);
      c->set_peak_bytes(c->graph_bytes() + s.params * kBytesPerElem);
    }
  }
  if (!TiedParameters(spec.model).empty()) {
    p.set_tied_bytes(spec.model.vocab * spec.model.d_model * 4.0);
  }
  return p;
}

absl::Status ValidateProfile(const v1::Profile& p) {
  if (p.version() != kProfileVersion) {
    return Bad("version", absl::StrCat("is ", p.version(), "; this build reads version ",
                                       kProfileVersion, " (profile the model again)"));
  }
  if (p.model_key().empty()) return Bad("model_key", "is empty");
  if (p.micro_batches().empty()) return Bad("micro_batches", "is empty");
  for (int i = 0; i < p.micro_batches_size(); ++i) {
    if (p.micro_batches(i) < 1 || (i > 0 && p.micro_batches(i) <= p.micro_batches(i - 1))) {
      return Bad(absl::StrCat("micro_batches[", i, "]"), "must be positive and ascending");
    }
  }
  if (p.segments().empty()) return Bad("segments", "is empty");
  for (int s = 0; s < p.segments_size(); ++s) {
    const auto& seg = p.segments(s);
    const std::string f = absl::StrCat("segments[", s, "]");
    if (seg.index() != s) return Bad(f + ".index", absl::StrCat("is ", seg.index()));
    RETURN_IF_ERROR(CheckNumber(f + ".param_bytes", seg.param_bytes()));
    RETURN_IF_ERROR(CheckNumber(f + ".optimizer_s", seg.optimizer_s()));
    if (seg.costs_size() != p.micro_batches_size()) {
      return Bad(f + ".costs", absl::StrCat("has ", seg.costs_size(), " entries for ",
                                            p.micro_batches_size(), " micro-batch sizes"));
    }
    for (int c = 0; c < seg.costs_size(); ++c) {
      const auto& k = seg.costs(c);
      const std::string g = absl::StrCat(f, ".costs[", c, "]");
      if (k.micro_batch() != p.micro_batches(c)) {
        return Bad(g + ".micro_batch",
                   absl::StrCat("is ", k.micro_batch(), ", expected ", p.micro_batches(c)));
      }
      RETURN_IF_ERROR(CheckNumber(g + ".forward_s", k.forward_s()));
      RETURN_IF_ERROR(CheckNumber(g + ".forward_nograd_s", k.forward_nograd_s()));
      RETURN_IF_ERROR(CheckNumber(g + ".recompute_s", k.recompute_s()));
      RETURN_IF_ERROR(CheckNumber(g + ".backward_s", k.backward_s()));
      RETURN_IF_ERROR(CheckNumber(g + ".weight_s", k.weight_s()));
      RETURN_IF_ERROR(CheckNumber(g + ".activation_bytes", k.activation_bytes()));
      RETURN_IF_ERROR(CheckNumber(g + ".graph_bytes", k.graph_bytes()));
      RETURN_IF_ERROR(CheckNumber(g + ".peak_bytes", k.peak_bytes()));
    }
  }
  RETURN_IF_ERROR(CheckSamples("p2p_same_host", p.p2p_same_host()));
  RETURN_IF_ERROR(CheckSamples("p2p_cross_host", p.p2p_cross_host()));
  for (int i = 0; i < p.allreduce_size(); ++i) {
    const auto& a = p.allreduce(i);
    const std::string f = absl::StrCat("allreduce[", i, "]");
    if (a.group_size() < 2) return Bad(f + ".group_size", "must be >= 2");
    if (a.samples().empty()) return Bad(f + ".samples", "is empty");
    RETURN_IF_ERROR(CheckSamples(f + ".samples", a.samples()));
  }
  RETURN_IF_ERROR(CheckNumber("tied_bytes", p.tied_bytes()));
  RETURN_IF_ERROR(CheckNumber("step_overhead_s", p.step_overhead_s()));
  RETURN_IF_ERROR(CheckNumber("compute_slowdown", p.compute_slowdown()));
  if (p.slots_per_host() < 0) return Bad("slots_per_host", "must be >= 0");
  return absl::OkStatus();
}

absl::Status CheckProfileFor(const v1::Profile& p, const JobSpec& spec) {
  RETURN_IF_ERROR(ValidateProfile(p));
  const std::string key = ModelKey(spec.model);
  if (p.model_key() != key) {
    return absl::FailedPreconditionError(absl::StrCat("profile is for model '", p.model_key(),
                                                      "', this job's model is '", key, "'"));
  }
  if (p.precision() != spec.train.precision) {
    return absl::FailedPreconditionError(absl::StrCat(
        "profile was measured in ", p.precision(), ", this job trains in ", spec.train.precision));
  }
  if (spec.model.kind != "torchscript") {
    const int want = spec.model.layers + 2;
    if (p.segments_size() != want) {
      return absl::FailedPreconditionError(
          absl::StrCat("profile has ", p.segments_size(), " segments, this model has ", want));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Profile> ParseProfileJson(const std::string& json) {
  if (json.size() > static_cast<size_t>(kMaxProfileBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: ", json.size(), " bytes; the limit is ", kMaxProfileBytes));
  }
  v1::Profile p;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = false;
  auto st = google::protobuf::util::JsonStringToMessage(json, &p, opts);
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: not a valid profile JSON: ", st.message().as_string()));
  }
  RETURN_IF_ERROR(ValidateProfile(p));
  return p;
}

std::string ProfileToJson(const v1::Profile& p) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(p, &out, opts);
  return out;
}

absl::Status WriteProfileFile(const std::string& path, const v1::Profile& profile) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << ProfileToJson(profile);
    if (!f.good()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Profile> LoadProfile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kMaxProfileBytes, "profile"));
  auto p = ParseProfileJson(text);
  if (!p.ok())
    return absl::Status(p.status().code(), absl::StrCat(path, ": ", p.status().message()));
  return p;
}

SegmentTimes CostAt(const v1::SegmentProfile& seg, int micro_batch) {
  std::vector<double> xs;
  std::vector<double> f, fn, r, b, w, a, g, pk;
  for (const auto& c : seg.costs()) {
    xs.push_back(c.micro_batch());
    f.push_back(c.forward_s());
    fn.push_back(c.forward_nograd_s());
    r.push_back(c.recompute_s());
    b.push_back(c.backward_s());
    w.push_back(c.weight_s());
    a.push_back(c.activation_bytes());
    g.push_back(c.graph_bytes());
    pk.push_back(c.peak_bytes());
  }
  const double x = micro_batch;
  SegmentTimes t;
  t.forward_s = Interpolate(xs, f, x);
  t.forward_nograd_s = Interpolate(xs, fn, x);
  t.recompute_s = Interpolate(xs, r, x);
  t.backward_s = Interpolate(xs, b, x);
  t.weight_s = std::min(Interpolate(xs, w, x), t.backward_s);
  t.activation_bytes = Interpolate(xs, a, x);
  t.graph_bytes = Interpolate(xs, g, x);
  t.peak_bytes = Interpolate(xs, pk, x);
  return t;
}

double TransferTime(const google::protobuf::RepeatedPtrField<v1::TransferSample>& samples,
                    double bytes) {
  if (samples.empty()) return kBuiltinLatency + bytes / kBuiltinBandwidth;
  return SampleTime(samples, bytes);
}

double CommModel::P2P(double bytes, bool cross_host) const {
  if (cross_host) {
    if (!profile_.p2p_cross_host().empty()) return SampleTime(profile_.p2p_cross_host(), bytes);
    return kBuiltinCrossLatency + bytes / kBuiltinCrossBandwidth;
  }
  return TransferTime(profile_.p2p_same_host(), bytes);
}

double CommModel::AllReduce(double bytes, int group, bool cross_host) const {
  if (group <= 1) return 0;
  // Exact group size and locality if measured; otherwise scale the nearest measured group by
  // the ring model t = 2(g-1) * latency + 2(g-1)/g * bytes / bandwidth.
  const v1::AllReduceProfile* best = nullptr;
  for (const auto& a : profile_.allreduce()) {
    if (a.cross_host() != cross_host) continue;
    if (a.group_size() == group) return SampleTime(a.samples(), bytes);
    if (best == nullptr ||
        std::abs(a.group_size() - group) < std::abs(best->group_size() - group)) {
      best = &a;
    }
  }
  const double g = group;
  if (best != nullptr) {
    const double g0 = best->group_size();
    const double latency_part = SampleTime(best->samples(), 1.0);
    const double volume_part = std::max(0.0, SampleTime(best->samples(), bytes) - latency_part);
    return latency_part * (g - 1) / (g0 - 1) + volume_part * ((g - 1) / g) / ((g0 - 1) / g0);
  }
  // From the p2p link: each ring step sends bytes/g.
  const double step = P2P(bytes / g, cross_host);
  return 2 * (g - 1) * step;
}

std::vector<std::string> CommModel::Notes() const {
  std::vector<std::string> notes;
  if (profile_.device() == "builtin") return notes;
  if (profile_.p2p_same_host().empty()) {
    notes.push_back(
        "same-host transfers were not measured (single-process profile): built-in link model");
  }
  if (profile_.p2p_cross_host().empty()) {
    notes.push_back("cross-host transfers were not measured: built-in 10 Gb/s link model");
  }
  if (profile_.allreduce().empty()) {
    notes.push_back("all-reduce was not measured: ring model over the p2p link");
  }
  return notes;
}

}  // namespace varuna

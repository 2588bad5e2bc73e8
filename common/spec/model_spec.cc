#include "common/spec/model_spec.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"

namespace varuna {
namespace {

enum class Field {
  kKind,
  kLayers,
  kDModel,
  kHeads,
  kSeqLen,
  kVocab,
  kDropout,
  kPath,
  kKvHeads,
  kFfn,
  kNormEps,
  kRopeTheta,
  kTie,
  kMaxPositions,
  kTypeVocab,
  kMaskToken,
  kInitFrom,
};

// Which kinds take a key: our own kinds (gpt, mlp, torchscript) take our names, as they
// always have; llama, gpt2 and bert take Hugging Face's.
enum Kinds : unsigned { kOurs = 1, kLlama = 2, kGpt2 = 4, kBert = 8, kAll = 15 };

struct KeyDef {
  const char* key;
  Field field;
  unsigned kinds;
};

const std::vector<KeyDef>& KeyDefs() {
  static const auto* defs = new std::vector<KeyDef>{
      {"kind", Field::kKind, kAll},
      {"seq_len", Field::kSeqLen, kAll},
      {"dropout", Field::kDropout, kAll},
      {"layers", Field::kLayers, kOurs},
      {"d_model", Field::kDModel, kOurs},
      {"heads", Field::kHeads, kOurs},
      {"vocab", Field::kVocab, kOurs},
      {"path", Field::kPath, kOurs},
      {"init_from", Field::kInitFrom, kLlama | kGpt2 | kBert},
      {"vocab_size", Field::kVocab, kLlama | kGpt2 | kBert},
      {"hidden_size", Field::kDModel, kLlama | kBert},
      {"intermediate_size", Field::kFfn, kLlama | kBert},
      {"num_hidden_layers", Field::kLayers, kLlama | kBert},
      {"num_attention_heads", Field::kHeads, kLlama | kBert},
      {"num_key_value_heads", Field::kKvHeads, kLlama},
      {"rms_norm_eps", Field::kNormEps, kLlama},
      {"rope_theta", Field::kRopeTheta, kLlama},
      {"tie_word_embeddings", Field::kTie, kLlama},
      {"max_position_embeddings", Field::kMaxPositions, kLlama | kBert},
      {"n_embd", Field::kDModel, kGpt2},
      {"n_inner", Field::kFfn, kGpt2},
      {"n_layer", Field::kLayers, kGpt2},
      {"n_head", Field::kHeads, kGpt2},
      {"layer_norm_epsilon", Field::kNormEps, kGpt2},
      {"n_positions", Field::kMaxPositions, kGpt2},
      {"layer_norm_eps", Field::kNormEps, kBert},
      {"type_vocab_size", Field::kTypeVocab, kBert},
      {"mask_token_id", Field::kMaskToken, kBert},
  };
  return *defs;
}

unsigned KindBit(const std::string& kind) {
  if (kind == "llama") return kLlama;
  if (kind == "gpt2") return kGpt2;
  if (kind == "bert") return kBert;
  return kOurs;
}

// The name `kind` gives `field` ("model.hidden_size" for llama's d_model).
std::string Name(const std::string& kind, Field field) {
  for (const KeyDef& d : KeyDefs()) {
    if (d.field == field && (d.kinds & KindBit(kind))) return absl::StrCat("model.", d.key);
  }
  return "model.?";
}

absl::Status Bad(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: '", key, "' ", what));
}

absl::Status InRange(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return Bad(key, absl::StrCat("is ", v, "; it must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// The shortest text that reads back as `v` ("1e-06", not "9.9999999999999995e-07").
std::string Number(double v) {
  for (int digits = 6; digits <= 17; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

absl::Status SetField(Field f, const std::string& text, ModelSpec* m) {
  auto as_int = [&](int* out) { return absl::SimpleAtoi(text, out); };
  auto as_double = [&](double* out) { return absl::SimpleAtod(text, out); };
  switch (f) {
    case Field::kKind:
      m->kind = text;
      return absl::OkStatus();
    case Field::kPath:
      m->path = text;
      return absl::OkStatus();
    case Field::kInitFrom:
      m->init_from = text;
      return absl::OkStatus();
    case Field::kLayers:
      return as_int(&m->layers) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kDModel:
      return as_int(&m->d_model) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kHeads:
      return as_int(&m->heads) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kSeqLen:
      return as_int(&m->seq_len) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kVocab:
      return as_int(&m->vocab) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kKvHeads:
      return as_int(&m->kv_heads) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kFfn:
      return as_int(&m->ffn) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kMaxPositions:
      return as_int(&m->max_positions) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kTypeVocab:
      return as_int(&m->type_vocab) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kMaskToken:
      return absl::SimpleAtoi(text, &m->mask_token) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kDropout:
      return as_double(&m->dropout) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kNormEps:
      return as_double(&m->norm_eps) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kRopeTheta:
      return as_double(&m->rope_theta) ? absl::OkStatus() : absl::UnknownError("");
    case Field::kTie:
      if (text == "true" || text == "True") {
        m->tie_embeddings = true;
      } else if (text == "false" || text == "False") {
        m->tie_embeddings = false;
      } else {
        return absl::UnknownError("");
      }
      return absl::OkStatus();
  }
  return absl::UnknownError("");
}

// The value of `field` in *m as the text config.json and the spec compare.
std::string FieldText(const ModelSpec& m, Field f) {
  switch (f) {
    case Field::kKind:
      return m.kind;
    case Field::kPath:
      return m.path;
    case Field::kInitFrom:
      return m.init_from;
    case Field::kLayers:
      return absl::StrCat(m.layers);
    case Field::kDModel:
      return absl::StrCat(m.d_model);
    case Field::kHeads:
      return absl::StrCat(m.heads);
    case Field::kSeqLen:
      return absl::StrCat(m.seq_len);
    case Field::kVocab:
      return absl::StrCat(m.vocab);
    case Field::kKvHeads:
      return absl::StrCat(m.kv_heads);
    case Field::kFfn:
      return absl::StrCat(m.ffn);
    case Field::kMaxPositions:
      return absl::StrCat(m.max_positions);
    case Field::kTypeVocab:
      return absl::StrCat(m.type_vocab);
    case Field::kMaskToken:
      return absl::StrCat(m.mask_token);
    case Field::kDropout:
      return Number(m.dropout);
    case Field::kNormEps:
      return Number(m.norm_eps);
    case Field::kRopeTheta:
      return Number(m.rope_theta);
    case Field::kTie:
      return m.tie_embeddings ? "true" : "false";
  }
  return "";
}

// The architecture fields config.json supplies for each Hugging Face kind.
bool IsArchitecture(Field f) {
  return f != Field::kKind && f != Field::kSeqLen && f != Field::kDropout && f != Field::kPath &&
         f != Field::kInitFrom && f != Field::kMaskToken;
}

}  // namespace

bool IsHfKind(const std::string& kind) {
  return kind == "llama" || kind == "gpt2" || kind == "bert";
}

const std::vector<std::string>& ModelKeys() {
  static const auto* keys = [] {
    auto* k = new std::vector<std::string>;
    for (const KeyDef& d : KeyDefs()) k->push_back(d.key);
    return k;
  }();
  return *keys;
}

absl::Status SetModelKey(const std::string& key, const std::string& text, ModelSpec* m) {
  for (const KeyDef& d : KeyDefs()) {
    if (key != d.key) continue;
    if (!SetField(d.field, text, m).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec: 'model.", key, "' has an invalid value '", text, "'"));
    }
    m->given.insert(key);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("job spec: unknown key 'model.", key, "'"));
}

void FillModelDefaults(ModelSpec* m) {
  if (!IsHfKind(m->kind)) return;
  const bool llama = m->kind == "llama", bert = m->kind == "bert";
  if (m->kv_heads == 0) m->kv_heads = m->heads;
  if (m->ffn == 0) m->ffn = 4 * m->d_model;
  if (m->norm_eps == 0) m->norm_eps = llama ? 1e-6 : bert ? 1e-12 : 1e-5;
  if (m->rope_theta == 0) m->rope_theta = 10000;
  if (m->max_positions == 0) m->max_positions = llama ? 2048 : bert ? 512 : 1024;
  if (bert && m->type_vocab == 0) m->type_vocab = 2;
  if (!llama) m->tie_embeddings = true;
}

absl::Status CheckTensorParallel(const ModelSpec& m, int tp) {
  const std::string what = absl::StrCat("parallel.tp_size = ", tp);
  if (m.kind == "torchscript") {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": a TorchScript model cannot be split for tensor parallelism (its linear layers "
        "are compiled into the segments, out of the engine's reach); use tp_size 1, or a "
        "built-in model (gpt, mlp, llama)"));
  }
  if (m.kind == "gpt2" || m.kind == "bert") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": model.kind ", m.kind,
                     " does not split for tensor parallelism yet (gpt, mlp and llama do)"));
  }
  auto divides = [&](const std::string& field, int64_t n, const std::string& why) {
    if (n % tp == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " does not divide ", field, " = ", n,
                                                   ": each tensor-parallel rank holds ", why));
  };
  if (m.kind == "gpt" || m.kind == "llama") {
    RETURN_IF_ERROR(divides(Name(m.kind, Field::kHeads), m.heads, "whole attention heads"));
  }
  if (m.kind == "llama") {
    const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
    RETURN_IF_ERROR(divides(Name(m.kind, Field::kKvHeads), kv, "whole key-value heads"));
    RETURN_IF_ERROR(divides(Name(m.kind, Field::kFfn), m.ffn, "an equal share of the MLP"));
  } else {
    RETURN_IF_ERROR(divides("4 x model.d_model", 4LL * m.d_model, "an equal share of the MLP"));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const ModelSpec& m) {
  static const std::vector<std::string> kKinds = {"gpt",   "mlp",  "torchscript",
                                                  "llama", "gpt2", "bert"};
  if (std::find(kKinds.begin(), kKinds.end(), m.kind) == kKinds.end()) {
    return Bad("model.kind",
               absl::StrCat("is '", m.kind, "'; it must be one of ", absl::StrJoin(kKinds, ", ")));
  }
  const unsigned bit = KindBit(m.kind);
  for (const std::string& key : m.given) {
    for (const KeyDef& d : KeyDefs()) {
      if (key != d.key || (d.kinds & bit)) continue;
      const std::string own = Name(m.kind, d.field);
      return Bad(absl::StrCat("model.", key),
                 absl::StrCat("is not a field of model.kind ", m.kind,
                              own == "model.?" ? "" : absl::StrCat(" (it is called ", own, ")")));
    }
  }
  // With init_from the architecture comes from config.json (ResolveInitFrom checks it all
  // once it is filled in): the defaults standing in for it until then are not checked.
  if (!m.init_from.empty()) {
    for (const auto& [key, value] : ArchitectureKeys(m)) {
      if (m.given.count(key)) continue;
      RETURN_IF_ERROR(InRange("model.seq_len", m.seq_len, 1, 1 << 17));
      if (!(m.dropout >= 0 && m.dropout < 1)) return Bad("model.dropout", "must be in [0, 1)");
      return absl::OkStatus();
    }
  }
  const std::string& k = m.kind;
  RETURN_IF_ERROR(InRange(Name(k, Field::kLayers), m.layers, 1, 4096));
  RETURN_IF_ERROR(InRange(Name(k, Field::kDModel), m.d_model, 1, 65536));
  RETURN_IF_ERROR(InRange(Name(k, Field::kHeads), m.heads, 1, 1024));
  RETURN_IF_ERROR(InRange("model.seq_len", m.seq_len, 1, 1 << 17));
  RETURN_IF_ERROR(InRange(Name(k, Field::kVocab), m.vocab, 2, 1 << 22));
  if (!(m.dropout >= 0 && m.dropout < 1)) return Bad("model.dropout", "must be in [0, 1)");
  if ((k == "gpt" || IsHfKind(k)) && m.d_model % m.heads != 0) {
    return Bad(Name(k, Field::kHeads), absl::StrCat("(", m.heads, ") must divide ",
                                                    Name(k, Field::kDModel), " (", m.d_model, ")"));
  }
  if (k == "torchscript" && m.path.empty()) {
    return Bad("model.path", "is required for model.kind torchscript");
  }
  if (!IsHfKind(k)) return absl::OkStatus();
  RETURN_IF_ERROR(InRange(Name(k, Field::kFfn), m.ffn, 1, 1 << 20));
  RETURN_IF_ERROR(InRange(Name(k, Field::kMaxPositions), m.max_positions, 1, 1 << 24));
  if (!(m.norm_eps > 0 && m.norm_eps < 1)) {
    return Bad(Name(k, Field::kNormEps), "must be in (0, 1)");
  }
  if (m.seq_len > m.max_positions) {
    return Bad("model.seq_len",
               absl::StrCat("(", m.seq_len, ") is longer than ", Name(k, Field::kMaxPositions),
                            " (", m.max_positions, ")"));
  }
  if (k == "bert") {
    RETURN_IF_ERROR(InRange("model.type_vocab_size", m.type_vocab, 1, 1024));
    RETURN_IF_ERROR(InRange("model.mask_token_id", m.mask_token, -1, m.vocab - 1));
  }
  if (k == "llama") {
    RETURN_IF_ERROR(InRange(Name(k, Field::kKvHeads), m.kv_heads, 1, m.heads));
    if (m.heads % m.kv_heads != 0) {
      return Bad(
          "model.num_key_value_heads",
          absl::StrCat("(", m.kv_heads, ") must divide model.num_attention_heads (", m.heads, ")"));
    }
    if ((m.d_model / m.heads) % 2 != 0) {
      return Bad("model.hidden_size", absl::StrCat("/ num_attention_heads (", m.d_model / m.heads,
                                                   ") must be even for rotary positions"));
    }
    if (!(m.rope_theta > 1 && m.rope_theta < 1e12)) {
      return Bad("model.rope_theta", "must be in (1, 1e12)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<std::string>>> ModelLayout(const ModelSpec& m) {
  std::vector<std::vector<std::string>> out;
  auto blocks = [&](const std::string& prefix) {
    for (int i = 0; i < m.layers; ++i) out.push_back({absl::StrCat(prefix, i)});
  };
  if (m.kind == "gpt" || m.kind == "mlp") {
    out.push_back({"embed"});
    blocks("blocks.");
    out.push_back({"head"});
  } else if (m.kind == "llama") {
    out.push_back({"model.embed_tokens"});
    blocks("model.layers.");
    out.push_back({"model.norm", "lm_head"});
  } else if (m.kind == "gpt2") {
    out.push_back({"transformer.wte", "transformer.wpe"});
    blocks("transformer.h.");
    out.push_back({"transformer.ln_f", "lm_head"});
  } else if (m.kind == "bert") {
    out.push_back({"bert.embeddings"});
    blocks("bert.encoder.layer.");
    out.push_back({"cls.predictions"});
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "the modules of a ", m.kind, " model are known only to the worker (--list_modules)"));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> TiedParameters(const ModelSpec& m) {
  if (m.kind == "gpt") return {{"embed.wte", "head.lm_head"}};
  if (m.kind == "gpt2") return {{"transformer.wte.weight", "lm_head.weight"}};
  if (m.kind == "bert") {
    return {{"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"}};
  }
  if (m.kind == "llama" && m.tie_embeddings)
    return {{"model.embed_tokens.weight", "lm_head.weight"}};
  return {};
}

absl::Status ResolveInitFrom(ModelSpec* m) {
  if (m->init_from.empty()) return absl::OkStatus();
  if (!IsHfKind(m->kind)) {
    return Bad("model.init_from",
               absl::StrCat("needs model.kind llama, gpt2 or bert, not ", m->kind));
  }
  const std::string path = m->init_from + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, 1 << 20, "model.init_from config.json"));
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, path));
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  std::map<std::string, YAML::Node> cfg;
  RETURN_IF_ERROR(ForEachEntry(root, path, "", [&](const std::string& key, const YAML::Node& v) {
    if (!v.IsNull()) cfg[key] = v;
    return absl::OkStatus();
  }));
  auto text_of = [&](const std::string& key) -> std::string {
    auto it = cfg.find(key);
    return it != cfg.end() && it->second.IsScalar() ? it->second.Scalar() : "";
  };
  auto refuse = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", path, ": ", what,
                                                   "; model.kind ", m->kind, " cannot load it"));
  };
  const std::string type = text_of("model_type");
  if (!type.empty() && type != m->kind) {
    return refuse(absl::StrCat("model_type is '", type, "'"));
  }
  if (m->kind == "llama") {
    if (const std::string a = text_of("hidden_act"); !a.empty() && a != "silu") {
      return refuse(absl::StrCat("hidden_act is '", a, "' (only silu)"));
    }
    if (cfg.count("rope_scaling")) return refuse("rope_scaling is set (not supported)");
    // transformers 5 writes the rotary settings as rope_parameters: {rope_type, rope_theta}.
    if (auto it = cfg.find("rope_parameters"); it != cfg.end()) {
      const YAML::Node& rp = it->second;
      if (!rp.IsMap()) return refuse("rope_parameters is not an object");
      const YAML::Node type_node = rp["rope_type"];
      const std::string rope_type = type_node && type_node.IsScalar() ? type_node.Scalar() : "";
      if (!rope_type.empty() && rope_type != "default") {
        return refuse(absl::StrCat("rope_parameters.rope_type is '", rope_type,
                                   "' (only the default rotary embedding)"));
      }
      if (const YAML::Node theta = rp["rope_theta"]; theta && !theta.IsNull()) {
        if (!theta.IsScalar()) return refuse("rope_parameters.rope_theta is not a number");
        if (const std::string top = text_of("rope_theta"); !top.empty() && top != theta.Scalar()) {
          return refuse(absl::StrCat("rope_theta is ", top, " but rope_parameters.rope_theta is ",
                                     theta.Scalar()));
        }
        cfg.erase("rope_theta");
        cfg.emplace("rope_theta", theta);
      }
    }
    // One head is hidden_size / num_attention_heads wide here; a config that says otherwise
    // (head_dim) describes another model.
    if (const std::string hd = text_of("head_dim"); !hd.empty()) {
      int head_dim = 0, hidden = 0, heads = 0;
      if (!absl::SimpleAtoi(hd, &head_dim) || !absl::SimpleAtoi(text_of("hidden_size"), &hidden) ||
          !absl::SimpleAtoi(text_of("num_attention_heads"), &heads) || heads <= 0 ||
          head_dim * heads != hidden) {
        return refuse(absl::StrCat("head_dim is ", hd, ", not hidden_size / num_attention_heads"));
      }
    }
    for (const char* bias : {"attention_bias", "mlp_bias"}) {
      if (const std::string b = text_of(bias); b == "true" || b == "True") {
        return refuse(absl::StrCat(bias, " is true (Llama has no biases here)"));
      }
    }
  } else if (m->kind == "bert") {
    if (const std::string a = text_of("hidden_act"); !a.empty() && a != "gelu") {
      return refuse(absl::StrCat("hidden_act is '", a, "' (only gelu)"));
    }
    if (const std::string p = text_of("position_embedding_type"); !p.empty() && p != "absolute") {
      return refuse(absl::StrCat("position_embedding_type is '", p, "' (only absolute)"));
    }
    if (const std::string d = text_of("is_decoder"); d == "true" || d == "True") {
      return refuse("is_decoder is true (an encoder only)");
    }
  } else {
    if (const std::string a = text_of("activation_function"); !a.empty() && a != "gelu_new") {
      return refuse(absl::StrCat("activation_function is '", a, "' (only gelu_new)"));
    }
    if (text_of("scale_attn_by_inverse_layer_idx") == "true") {
      return refuse("scale_attn_by_inverse_layer_idx is true (not supported)");
    }
  }
  const unsigned bit = KindBit(m->kind);
  ModelSpec from_file = *m;
  for (const KeyDef& d : KeyDefs()) {
    if (!(d.kinds & bit) || !IsArchitecture(d.field)) continue;
    auto it = cfg.find(d.key);
    if (it == cfg.end()) {
      if (m->given.count(d.key)) continue;  // the spec's value
      if (d.field == Field::kLayers || d.field == Field::kDModel || d.field == Field::kHeads ||
          d.field == Field::kVocab) {
        return refuse(absl::StrCat("it lacks ", d.key));
      }
      // Left out of both: the kind's default, as Hugging Face's config classes have it.
      if (d.field != Field::kTie) SetField(d.field, "0", &from_file).IgnoreError();
      continue;
    }
    if (!it->second.IsScalar() || !SetField(d.field, it->second.Scalar(), &from_file).ok()) {
      return refuse(absl::StrCat(d.key, " has an invalid value '", Describe(it->second), "'"));
    }
    if (m->given.count(d.key) && FieldText(*m, d.field) != FieldText(from_file, d.field)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.", d.key, " is ", FieldText(*m, d.field), " in the job spec but ",
                       FieldText(from_file, d.field), " in ", path));
    }
  }
  from_file.given = m->given;
  *m = std::move(from_file);
  FillModelDefaults(m);
  for (const auto& [key, value] : ArchitectureKeys(*m)) m->given.insert(key);
  return ValidateModel(*m);
}

std::vector<std::pair<std::string, std::string>> ArchitectureKeys(const ModelSpec& m) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!IsHfKind(m.kind)) return out;
  for (const KeyDef& d : KeyDefs()) {
    if ((d.kinds & KindBit(m.kind)) && IsArchitecture(d.field)) {
      out.emplace_back(d.key, FieldText(m, d.field));
    }
  }
  return out;
}

absl::StatusOr<std::string> HfConfigJson(const ModelSpec& m, const std::string& torch_dtype) {
  if (!IsHfKind(m.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.kind ", m.kind, " has no Hugging Face form (llama, gpt2, bert have)"));
  }
  std::vector<std::pair<std::string, std::string>> f;  // key -> JSON value
  auto q = [](const std::string& s) { return absl::StrCat("\"", s, "\""); };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  if (m.kind == "llama") {
    f = {{"architectures", "[\"LlamaForCausalLM\"]"},
         {"model_type", q("llama")},
         {"hidden_act", q("silu")},
         {"hidden_size", absl::StrCat(m.d_model)},
         {"intermediate_size", absl::StrCat(m.ffn)},
         {"num_hidden_layers", absl::StrCat(m.layers)},
         {"num_attention_heads", absl::StrCat(m.heads)},
         {"num_key_value_heads", absl::StrCat(m.kv_heads)},
         {"head_dim", absl::StrCat(m.d_model / m.heads)},
         {"rms_norm_eps", Number(m.norm_eps)},
         {"rope_theta", Number(m.rope_theta)},
         {"rope_scaling", "null"},
         {"attention_bias", "false"},
         {"attention_dropout", "0.0"},
         {"mlp_bias", "false"},
         {"vocab_size", absl::StrCat(m.vocab)},
         {"tie_word_embeddings", b(m.tie_embeddings)},
         {"max_position_embeddings", absl::StrCat(m.max_positions)},
         {"initializer_range", "0.02"}};
  } else if (m.kind == "bert") {
    const std::string drop = Number(m.dropout);
    f = {{"architectures", "[\"BertForMaskedLM\"]"},
         {"model_type", q("bert")},
         {"hidden_act", q("gelu")},
         {"hidden_size", absl::StrCat(m.d_model)},
         {"intermediate_size", absl::StrCat(m.ffn)},
         {"num_hidden_layers", absl::StrCat(m.layers)},
         {"num_attention_heads", absl::StrCat(m.heads)},
         {"layer_norm_eps", Number(m.norm_eps)},
         {"max_position_embeddings", absl::StrCat(m.max_positions)},
         {"type_vocab_size", absl::StrCat(m.type_vocab)},
         {"vocab_size", absl::StrCat(m.vocab)},
         {"hidden_dropout_prob", drop},
         {"attention_probs_dropout_prob", drop},
         {"position_embedding_type", q("absolute")},
         {"is_decoder", "false"},
         {"tie_word_embeddings", "true"},
         {"initializer_range", "0.02"}};
  } else {
    const std::string drop = Number(m.dropout);
    f = {{"architectures", "[\"GPT2LMHeadModel\"]"},
         {"model_type", q("gpt2")},
         {"activation_function", q("gelu_new")},
         {"n_embd", absl::StrCat(m.d_model)},
         {"n_layer", absl::StrCat(m.layers)},
         {"n_head", absl::StrCat(m.heads)},
         {"n_inner", m.ffn == 4 * m.d_model ? "null" : absl::StrCat(m.ffn)},
         {"n_positions", absl::StrCat(m.max_positions)},
         {"n_ctx", absl::StrCat(m.max_positions)},
         {"vocab_size", absl::StrCat(m.vocab)},
         {"layer_norm_epsilon", Number(m.norm_eps)},
         {"resid_pdrop", drop},
         {"embd_pdrop", drop},
         {"attn_pdrop", drop},
         {"scale_attn_weights", "true"},
         {"tie_word_embeddings", "true"},
         {"initializer_range", "0.02"}};
  }
  f.emplace_back("torch_dtype", q(torch_dtype));
  std::string out = "{\n";
  for (size_t i = 0; i < f.size(); ++i) {
    absl::StrAppend(&out, "  \"", f[i].first, "\": ", f[i].second, i + 1 < f.size() ? ",\n" : "\n");
  }
  return out + "}\n";
}

std::string ModelSpecLine(const ModelSpec& m) {
  std::string line = absl::StrFormat("kind=%s layers=%d d_model=%d heads=%d seq_len=%d vocab=%d",
                                     m.kind, m.layers, m.d_model, m.heads, m.seq_len, m.vocab);
  if (IsHfKind(m.kind)) {
    absl::StrAppend(&line, " kv_heads=", m.kv_heads, " ffn=", m.ffn,
                    " norm_eps=", Number(m.norm_eps), " rope_theta=", Number(m.rope_theta),
                    " tie=", m.tie_embeddings ? 1 : 0, " max_positions=", m.max_positions);
  }
  if (m.kind == "bert") absl::StrAppend(&line, " type_vocab=", m.type_vocab);
  return absl::StrCat(line, " path=", m.path);
}

absl::StatusOr<ModelSpec> ParseModelSpecLine(const std::string& line) {
  ModelSpec m;
  const size_t path_at = line.find(" path=");
  if (path_at == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("not a model line: '", line, "'"));
  }
  m.path = line.substr(path_at + 6);
  std::map<std::string, std::string> kv;
  for (absl::string_view part : absl::StrSplit(line.substr(0, path_at), ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(part, absl::MaxSplits('=', 1));
    kv[p.first] = p.second;
  }
  bool ok = kv.count("kind") && absl::SimpleAtoi(kv["layers"], &m.layers) &&
            absl::SimpleAtoi(kv["d_model"], &m.d_model) &&
            absl::SimpleAtoi(kv["heads"], &m.heads) &&
            absl::SimpleAtoi(kv["seq_len"], &m.seq_len) && absl::SimpleAtoi(kv["vocab"], &m.vocab);
  m.kind = kv["kind"];
  if (ok && IsHfKind(m.kind)) {
    int tie = 0;
    ok = absl::SimpleAtoi(kv["kv_heads"], &m.kv_heads) && absl::SimpleAtoi(kv["ffn"], &m.ffn) &&
         absl::SimpleAtod(kv["norm_eps"], &m.norm_eps) &&
         absl::SimpleAtod(kv["rope_theta"], &m.rope_theta) && absl::SimpleAtoi(kv["tie"], &tie) &&
         absl::SimpleAtoi(kv["max_positions"], &m.max_positions);
    m.tie_embeddings = tie != 0;
  }
  if (ok && m.kind == "bert") ok = absl::SimpleAtoi(kv["type_vocab"], &m.type_vocab);
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("not a model line: '", line, "'"));
  if (absl::Status st = ValidateModel(m); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model line '", line, "' describes no valid model: ", st.message()));
  }
  return m;
}

absl::Status ResolveMaskToken(ModelSpec* m, const std::string& tokenizer_dir) {
  if (!IsMaskedLm(m->kind) || m->mask_token >= 0) return absl::OkStatus();
  if (tokenizer_dir.empty()) {
    return Bad("model.mask_token_id",
               "is required for model.kind bert without data.tokenizer_dir (whose "
               "tokenizer.json names the [MASK] token)");
  }
  // The mask token's text: tokenizer_config.json's mask_token (a string or {content: ...}),
  // else BERT's "[MASK]".
  std::string mask = "[MASK]";
  const std::string config_path = tokenizer_dir + "/tokenizer_config.json";
  if (CheckRegularFile(config_path, "data.tokenizer_dir tokenizer_config.json").ok()) {
    ASSIGN_OR_RETURN(std::string text, ReadRegularFile(config_path, 16 << 20,
                                                       "data.tokenizer_dir tokenizer_config.json"));
    ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, config_path));
    if (root.IsMap() && root["mask_token"]) {
      const YAML::Node t = root["mask_token"];
      if (t.IsScalar()) mask = t.Scalar();
      if (t.IsMap() && t["content"] && t["content"].IsScalar()) mask = t["content"].Scalar();
    }
  }
  const std::string path = tokenizer_dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string text,
                   ReadRegularFile(path, 256 << 20, "data.tokenizer_dir tokenizer.json"));
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(text, path));
  int64_t id = -1;
  if (root.IsMap() && root["added_tokens"] && root["added_tokens"].IsSequence()) {
    for (const YAML::Node& t : root["added_tokens"]) {
      if (t.IsMap() && t["content"] && t["content"].IsScalar() && t["content"].Scalar() == mask &&
          t["id"] && t["id"].IsScalar() && absl::SimpleAtoi(t["id"].Scalar(), &id)) {
        break;
      }
      id = -1;
    }
  }
  if (id < 0 && root.IsMap() && root["model"] && root["model"].IsMap()) {
    const YAML::Node vocab = root["model"]["vocab"];
    if (vocab && vocab.IsMap() && vocab[mask] && vocab[mask].IsScalar() &&
        !absl::SimpleAtoi(vocab[mask].Scalar(), &id)) {
      id = -1;
    }
  }
  if (id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has no token '", mask,
                     "' (model.kind bert masks with it); give model.mask_token_id"));
  }
  if (id >= m->vocab) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": '", mask, "' is token ", id,
                                                   ", outside the model's vocab_size ", m->vocab));
  }
  m->mask_token = id;
  return absl::OkStatus();
}

}  // namespace varuna

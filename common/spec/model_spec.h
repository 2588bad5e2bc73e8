#pragma once

// The job spec's model: its kinds, the keys each kind takes, the modules each built-in kind
// is made of, and the Hugging Face side (config.json in and out, model.init_from). No LibTorch:
// the worker builds the layers (worker/models/model.h), this file names them.
//
// Kinds: gpt (GPT-2-like, our names: embed, blocks.N, head), mlp, torchscript (segment files),
// and three that follow Hugging Face exactly, with its field and module names:
//   llama  LlamaForCausalLM: model.embed_tokens, model.layers.N, model.norm, lm_head
//   gpt2   GPT2LMHeadModel:  transformer.wte, transformer.wpe, transformer.h.N,
//                            transformer.ln_f, lm_head (tied to transformer.wte)
//   bert   BertForMaskedLM:  bert.embeddings, bert.encoder.layer.N, cls.predictions (its
//                            decoder tied to bert.embeddings.word_embeddings); trained as a
//                            masked language model (docs/models.md "BERT")

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

struct ModelSpec {
  std::string kind = "gpt";  // gpt | mlp | torchscript | llama | gpt2 | bert
  int layers = 4;            // gpt: blocks; mlp: hidden blocks; llama/gpt2: num_hidden_layers
  int d_model = 128;         // llama hidden_size, gpt2 n_embd
  int heads = 4;             // gpt, llama, gpt2; must divide d_model
  int seq_len = 64;          // tokens per sample
  int vocab = 256;           // token ids must be < vocab
  double dropout = 0.0;      // in [0, 1)
  std::string path;          // torchscript: directory holding segment_<i>.pt files
  // llama and gpt2 (0 = the kind's default, filled in by the parser: FillModelDefaults):
  int kv_heads = 0;             // llama num_key_value_heads (default: heads)
  int ffn = 0;                  // llama intermediate_size, gpt2 n_inner (default: 4 x d_model)
  double norm_eps = 0;          // llama rms_norm_eps (1e-6), gpt2 layer_norm_epsilon (1e-5)
  double rope_theta = 0;        // llama (10000)
  bool tie_embeddings = false;  // llama tie_word_embeddings; gpt2 always ties
  int max_positions = 0;        // llama max_position_embeddings (2048), gpt2 n_positions (1024)
  int type_vocab = 0;           // bert type_vocab_size (2)
  // bert: the [MASK] token's id; -1: data.tokenizer_dir's (ResolveMaskToken).
  int64_t mask_token = -1;
  std::string init_from;  // a Hugging Face model directory to start from (llama, gpt2, bert)
  // The keys the spec's model section gave, by the name it gave them (parse time only).
  std::set<std::string> given;
};

// True for the kinds that follow Hugging Face (llama, gpt2, bert).
bool IsHfKind(const std::string& kind);
// True for the kinds trained as masked language models (bert): a sample's loss is over its
// masked positions, not every next token.
inline bool IsMaskedLm(const std::string& kind) { return kind == "bert"; }
// bert without model.mask_token_id: the id of "[MASK]" in `tokenizer_dir`'s tokenizer.json
// (its added tokens, else its model's vocabulary); an error naming both keys when there is
// neither. Other kinds: nothing.
absl::Status ResolveMaskToken(ModelSpec* m, const std::string& tokenizer_dir);

// The keys of the job spec's model section, every kind's: our names and Hugging Face's (which
// names a kind accepts is checked by ValidateModel).
const std::vector<std::string>& ModelKeys();
// Sets *m's field for `key` from its text and records the key in m->given; InvalidArgument
// "job spec: 'model.<key>' has an invalid value '<text>'".
absl::Status SetModelKey(const std::string& key, const std::string& text, ModelSpec* m);

// Fills the kind's defaults into fields left 0 (after parsing, and after init_from).
void FillModelDefaults(ModelSpec* m);

// The model's cross-field rules, in the kind's own key names: a key the kind does not take,
// heads | d_model, kv_heads | heads, even head size for rotary, seq_len <= max_positions ...
absl::Status ValidateModel(const ModelSpec& m);
// Whether `m` can be split over `tp_size` tensor-parallel ranks (worker/models/tensor_parallel.h):
// a built-in kind that splits (gpt, mlp, llama), whole heads (and key-value heads) and hidden
// units per rank. Errors name the numbers.
inline constexpr int kMaxTensorParallel = 64;
absl::Status CheckTensorParallel(const ModelSpec& m, int tp_size);

// The segments of a built-in kind, each the module names in it (the worker's layer names):
// one segment per cut, e.g. llama: [model.embed_tokens] [model.layers.0] .. [model.norm,
// lm_head]. Unimplemented for torchscript (the worker reads the files).
absl::StatusOr<std::vector<std::vector<std::string>>> ModelLayout(const ModelSpec& m);

// Tied parameter pairs (first, second) by full name: gpt's embed.wte/head.lm_head, gpt2's
// transformer.wte.weight/lm_head.weight, llama's when tie_word_embeddings.
std::vector<std::pair<std::string, std::string>> TiedParameters(const ModelSpec& m);

// model.init_from: reads DIR/config.json (a regular file, bounded), checks it describes a
// model this kind can load (model_type, activation, no rope scaling or biases we lack), and
// fills every architecture field the spec left out (and marks it given); a field the spec
// gave must match, and a mismatch names both values. model.kind must be given.
absl::Status ResolveInitFrom(ModelSpec* m);

// The kind's architecture keys (Hugging Face names for llama and gpt2) with their values as
// text: what init_from reads from config.json, and what varunactl writes into the spec.
std::vector<std::pair<std::string, std::string>> ArchitectureKeys(const ModelSpec& m);

// config.json for a llama or gpt2 model (Hugging Face's field names and defaults).
absl::StatusOr<std::string> HfConfigJson(const ModelSpec& m, const std::string& torch_dtype);

// The one-line model description a checkpoint records (Note [Resume] in the worker): equal
// lines mean the same architecture. gpt/mlp/torchscript keep the format of old checkpoints.
std::string ModelSpecLine(const ModelSpec& m);
// Back from the line (for varuna-ckpt export); InvalidArgument if it is not one.
absl::StatusOr<ModelSpec> ParseModelSpecLine(const std::string& line);

}  // namespace varuna

#include "common/spec/model_spec.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/spec/job_topology.h"
#include "common/spec/submission.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

absl::StatusOr<JobSpec> Spec(const std::string& model) {
  return ParseJobSpec(absl::StrCat("data: {kind: tokens, path: /x}\nmodel: ", model, "\n"));
}

TEST(ModelSpecTest, HuggingFaceNamesPerKind) {
  ASSERT_OK_AND_ASSIGN(JobSpec s, Spec("{kind: llama, hidden_size: 64, num_hidden_layers: 2, "
                                       "num_attention_heads: 4, num_key_value_heads: 2, "
                                       "intermediate_size: 96, vocab_size: 300}"));
  EXPECT_EQ(s.model.d_model, 64);
  EXPECT_EQ(s.model.layers, 2);
  EXPECT_EQ(s.model.kv_heads, 2);
  EXPECT_EQ(s.model.ffn, 96);
  EXPECT_EQ(s.model.norm_eps, 1e-6);  // LlamaConfig's defaults
  EXPECT_EQ(s.model.rope_theta, 10000);
  EXPECT_EQ(s.model.max_positions, 2048);
  EXPECT_FALSE(s.model.tie_embeddings);
  ASSERT_OK_AND_ASSIGN(JobSpec g, Spec("{kind: gpt2, n_embd: 48, n_layer: 3, n_head: 4}"));
  EXPECT_EQ(g.model.ffn, 4 * 48);
  EXPECT_EQ(g.model.norm_eps, 1e-5);
  EXPECT_TRUE(g.model.tie_embeddings);
  // Our names for their kinds, and theirs for ours, are refused with the right name.
  EXPECT_THAT(Spec("{kind: llama, d_model: 64}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'model.d_model' is not a field of model.kind llama (it is called "
                       "model.hidden_size)"));
  EXPECT_THAT(Spec("{kind: gpt, hidden_size: 64}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "called model.d_model"));
  EXPECT_THAT(Spec("{kind: gpt2, rope_theta: 5}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a field of model.kind gpt2"));
  // Cross-field rules, in the kind's names.
  EXPECT_THAT(Spec("{kind: llama, num_attention_heads: 4, num_key_value_heads: 3}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.num_key_value_heads"));
  EXPECT_THAT(Spec("{kind: llama, hidden_size: 12, num_attention_heads: 4}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "even for rotary"));
  EXPECT_THAT(Spec("{kind: gpt2, n_positions: 8, seq_len: 16}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.n_positions"));
  EXPECT_THAT(Spec("{kind: llama, tie_word_embeddings: maybe}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tie_word_embeddings"));
  EXPECT_THAT(Spec("{kind: gpt, init_from: /x}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a field of model.kind gpt"));
}

TEST(ModelSpecTest, LayoutsUseHuggingFaceModuleNames) {
  ModelSpec m;
  m.kind = "llama";
  m.layers = 2;
  ASSERT_OK_AND_ASSIGN(auto modules, BuiltinModules(m));
  EXPECT_THAT(modules, ElementsAre("model.embed_tokens", "model.layers.0", "model.layers.1",
                                   "model.norm", "lm_head"));
  EXPECT_THAT(BuiltinSegmentOf(m), ElementsAre(0, 1, 2, 3, 3));
  m.kind = "gpt2";
  ASSERT_OK_AND_ASSIGN(modules, BuiltinModules(m));
  EXPECT_THAT(modules, ElementsAre("transformer.wte", "transformer.wpe", "transformer.h.0",
                                   "transformer.h.1", "transformer.ln_f", "lm_head"));
  EXPECT_THAT(BuiltinSegmentOf(m), ElementsAre(0, 0, 1, 2, 3, 3));
  ASSERT_OK_AND_ASSIGN(auto labels, SegmentLabels(m, 4));
  EXPECT_THAT(labels, ElementsAre("transformer.wte,transformer.wpe", "transformer.h.0",
                                  "transformer.h.1", "transformer.ln_f,lm_head"));
  m.kind = "gpt";
  ASSERT_OK_AND_ASSIGN(modules, BuiltinModules(m));
  EXPECT_THAT(modules, ElementsAre("embed", "blocks.0", "blocks.1", "head"));
}

TEST(ModelSpecTest, SpecLineRoundTripsAndKeepsTheOldFormat) {
  ModelSpec gpt;
  EXPECT_EQ(ModelSpecLine(gpt), "kind=gpt layers=4 d_model=128 heads=4 seq_len=64 vocab=256 path=");
  ASSERT_OK_AND_ASSIGN(JobSpec s, Spec("{kind: llama, num_key_value_heads: 2, rms_norm_eps: "
                                       "1e-5, tie_word_embeddings: true}"));
  const std::string line = ModelSpecLine(s.model);
  EXPECT_THAT(line, HasSubstr("kv_heads=2 ffn=512 norm_eps=1e-05 rope_theta=10000 tie=1"));
  ASSERT_OK_AND_ASSIGN(ModelSpec back, ParseModelSpecLine(line));
  EXPECT_EQ(ModelSpecLine(back), line);
  EXPECT_THAT(ParseModelSpecLine("kind=llama layers=x path=").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a model line"));
}

class InitFromTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("init_from_test_", getpid());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "data.bin") << std::string(1000, 'a');
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Config(const std::string& json) { std::ofstream(dir_ / "config.json") << json; }
  ModelSpec Llama() {
    ModelSpec m;
    m.kind = "llama";
    m.init_from = dir_.string();
    m.given = {"kind", "init_from"};
    FillModelDefaults(&m);
    return m;
  }
  fs::path dir_;
};

// Hugging Face tensors load unsplit: a job that starts from them runs at tp_size 1 (and its
// checkpoint resumes at any tp_size), so tp_size > 1 with init_from is refused at submit.
TEST_F(InitFromTest, TensorParallelWithInitFromIsRefused) {
  Config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 300})");
  JobSpec spec;
  spec.data.path = "/x";
  spec.model = Llama();
  ASSERT_THAT(ResolveInitFrom(&spec.model), IsOk());
  spec.parallel.tp_size = 2;
  EXPECT_THAT(spec.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "cannot be used with parallel.tp_size = 2"));
  spec.parallel.tp_size = 0;  // auto: planned at 1 (PlanTensorParallelSizes)
  EXPECT_THAT(spec.Validate(), IsOk());
}

TEST_F(InitFromTest, FillsWhatTheSpecLeftOutAndChecksWhatItGave) {
  Config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 300, "rms_norm_eps": 1e-05, "rope_scaling": null,
             "torch_dtype": "bfloat16"})");
  ModelSpec m = Llama();
  ASSERT_THAT(ResolveInitFrom(&m), IsOk());
  EXPECT_EQ(m.d_model, 64);
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(m.norm_eps, 1e-5);
  EXPECT_EQ(m.rope_theta, 10000);  // absent from the file: LlamaConfig's default
  EXPECT_EQ(m.max_positions, 2048);
  EXPECT_TRUE(m.given.count("hidden_size"));
  ModelSpec wrong = Llama();
  wrong.heads = 8;
  wrong.given.insert("num_attention_heads");
  EXPECT_THAT(ResolveInitFrom(&wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "model.num_attention_heads is 8 in the job spec but 4 in"));
  // config.json the kind cannot load.
  Config(R"({"model_type": "gpt2", "n_embd": 4})");
  ModelSpec other = Llama();
  EXPECT_THAT(ResolveInitFrom(&other),
              StatusIs(absl::StatusCode::kInvalidArgument, "model_type is 'gpt2'"));
  Config(R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 9, "rope_scaling": {"type": "linear"}})");
  other = Llama();
  EXPECT_THAT(ResolveInitFrom(&other),
              StatusIs(absl::StatusCode::kInvalidArgument, "rope_scaling is set"));
  Config(R"({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 9})");
  other = Llama();
  EXPECT_THAT(ResolveInitFrom(&other),
              StatusIs(absl::StatusCode::kInvalidArgument, "lacks num_hidden_layers"));
  Config("not json {");
  other = Llama();
  EXPECT_FALSE(ResolveInitFrom(&other).ok());
  fs::remove(dir_ / "config.json");
  other = Llama();
  EXPECT_FALSE(ResolveInitFrom(&other).ok());
}

// transformers 5 writes config.json with rope_parameters (and head_dim) instead of a top-level
// rope_theta: the theta is read from there; another rope_type or head_dim is refused by name.
TEST_F(InitFromTest, ReadsTransformers5RopeParameters) {
  const std::string base = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "vocab_size": 300, "dtype": "float32")";
  Config("{" + base + R"(, "head_dim": 16,
             "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})");
  ModelSpec m = Llama();
  ASSERT_THAT(ResolveInitFrom(&m), IsOk());
  EXPECT_EQ(m.rope_theta, 500000);
  Config("{" + base + R"(, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3",
             "factor": 8.0}})");
  m = Llama();
  EXPECT_THAT(ResolveInitFrom(&m), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "rope_parameters.rope_type is 'llama3'"));
  Config("{" + base + R"(, "rope_theta": 10000.0, "rope_parameters": {"rope_theta": 20000.0}})");
  m = Llama();
  EXPECT_THAT(ResolveInitFrom(&m), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "but rope_parameters.rope_theta is 20000.0"));
  Config("{" + base + R"(, "rope_parameters": [1, 2]})");
  m = Llama();
  EXPECT_THAT(ResolveInitFrom(&m),
              StatusIs(absl::StatusCode::kInvalidArgument, "rope_parameters is not an object"));
  Config("{" + base + R"(, "head_dim": 32})");
  m = Llama();
  EXPECT_THAT(ResolveInitFrom(&m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "head_dim is 32, not hidden_size / num_attention_heads"));
}

// Before config.json is read, the kind's defaults stand in for the architecture: they are not
// held against the fields given (a seq_len past the default max_position_embeddings, more
// KV heads than the default heads).
TEST_F(InitFromTest, DefaultsDoNotRefuseASpecBeforeConfigJsonIsRead) {
  ASSERT_OK_AND_ASSIGN(JobSpec spec,
                       ParseJobSpec(absl::StrCat("model: {kind: llama, init_from: ", dir_.string(),
                                                 ", seq_len: 4096, num_key_value_heads: 8}\n",
                                                 "data: {kind: tokens, path: /x}\n")));
  Config(R"({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 300,
             "max_position_embeddings": 8192})");
  ASSERT_THAT(ResolveInitFrom(&spec.model), IsOk());
  EXPECT_EQ(spec.model.max_positions, 8192);
  EXPECT_EQ(spec.model.heads, 32);
}

TEST_F(InitFromTest, SubmissionWritesTheArchitectureIntoTheSpec) {
  Config(R"({"model_type": "gpt2", "n_embd": 48, "n_layer": 3, "n_head": 4,
             "n_positions": 32, "vocab_size": 300, "n_inner": null})");
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "name: j\nmodel: {kind: gpt2, init_from: " << dir_.string()
                     << ", seq_len: 16}\ndata: {kind: tokens, path: "
                     << (dir_ / "data.bin").string() << "}\n";
  SubmitOptions opts;
  ASSERT_OK_AND_ASSIGN(std::string yaml, PrepareSubmission(job, opts));
  ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(yaml));
  EXPECT_EQ(spec.model.d_model, 48);
  EXPECT_EQ(spec.model.max_positions, 32);
  EXPECT_THAT(spec.ValidateFiles(), IsOk());
  // The same spec without the architecture fails ValidateFiles (the manager's check).
  ASSERT_OK_AND_ASSIGN(JobSpec bare,
                       ParseJobSpec(absl::StrCat(
                           "model: {kind: gpt2, init_from: ", dir_.string(),
                           "}\ndata: {kind: tokens, path: ", (dir_ / "data.bin").string(), "}\n")));
  EXPECT_THAT(bare.ValidateFiles(),
              StatusIs(absl::StatusCode::kInvalidArgument, "missing: vocab_size, n_embd"));
}

}  // namespace
}  // namespace varuna

namespace varuna {
namespace {

// BERT (docs/models.md "BERT"): Hugging Face's names and defaults, its layout, the spec line,
// config.json both ways, the mask token from a tokenizer directory, and what is refused.
TEST(BertSpecTest, NamesDefaultsLayoutAndLine) {
  ASSERT_OK_AND_ASSIGN(JobSpec s, Spec("{kind: bert, hidden_size: 48, num_hidden_layers: 2, "
                                       "num_attention_heads: 4, vocab_size: 300, "
                                       "mask_token_id: 1, seq_len: 16}"));
  EXPECT_EQ(s.model.ffn, 192);
  EXPECT_EQ(s.model.max_positions, 512);
  EXPECT_EQ(s.model.type_vocab, 2);
  EXPECT_DOUBLE_EQ(s.model.norm_eps, 1e-12);
  EXPECT_EQ(s.model.mask_token, 1);
  EXPECT_TRUE(IsMaskedLm(s.model.kind));
  ASSERT_OK_AND_ASSIGN(auto layout, ModelLayout(s.model));
  EXPECT_EQ(layout.front(), std::vector<std::string>{"bert.embeddings"});
  EXPECT_EQ(layout[1], std::vector<std::string>{"bert.encoder.layer.0"});
  EXPECT_EQ(layout.back(), std::vector<std::string>{"cls.predictions"});
  EXPECT_THAT(TiedParameters(s.model),
              ElementsAre(std::make_pair(std::string("bert.embeddings.word_embeddings.weight"),
                                         std::string("cls.predictions.decoder.weight"))));
  const std::string line = ModelSpecLine(s.model);
  EXPECT_THAT(line, HasSubstr("type_vocab=2"));
  ASSERT_OK_AND_ASSIGN(ModelSpec back, ParseModelSpecLine(line));
  EXPECT_EQ(ModelSpecLine(back), line);
  ASSERT_OK_AND_ASSIGN(std::string config, HfConfigJson(s.model, "float32"));
  EXPECT_THAT(config, HasSubstr("\"BertForMaskedLM\""));
  EXPECT_THAT(config, HasSubstr("\"hidden_act\": \"gelu\""));
  EXPECT_THAT(config, HasSubstr("\"type_vocab_size\": 2"));
  // Another kind's name, a mask id outside the vocabulary, no mask source, tensor parallelism.
  EXPECT_THAT(Spec("{kind: bert, n_embd: 48, mask_token_id: 1}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "it is called model.hidden_size"));
  EXPECT_THAT(Spec("{kind: bert, vocab_size: 300, mask_token_id: 300}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.mask_token_id"));
  EXPECT_THAT(Spec("{kind: bert, vocab_size: 300}").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.mask_token_id' is required"));
  EXPECT_THAT(CheckTensorParallel(s.model, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "bert does not split"));
}

TEST_F(InitFromTest, BertConfigAndMaskTokenFromTheTokenizer) {
  Config(R"({"model_type": "bert", "hidden_act": "gelu", "hidden_size": 48,
             "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
             "vocab_size": 300, "max_position_embeddings": 32, "type_vocab_size": 2,
             "layer_norm_eps": 1e-12, "position_embedding_type": "absolute"})");
  ModelSpec m;
  m.kind = "bert";
  m.seq_len = 16;
  m.init_from = dir_.string();
  m.given = {"kind", "init_from"};
  FillModelDefaults(&m);
  ASSERT_THAT(ResolveInitFrom(&m), IsOk());
  EXPECT_EQ(m.layers, 3);
  EXPECT_EQ(m.ffn, 96);
  EXPECT_EQ(m.max_positions, 32);
  // [MASK] among the added tokens, named by tokenizer_config.json.
  std::ofstream(dir_ / "tokenizer_config.json") << R"({"mask_token": "[MASK]"})";
  std::ofstream(dir_ / "tokenizer.json")
      << R"({"added_tokens": [{"id": 0, "content": "[PAD]"}, {"id": 7, "content": "[MASK]"}],
            "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "[MASK]": 7, "a": 1}}})";
  ModelSpec with = m;
  ASSERT_THAT(ResolveMaskToken(&with, dir_.string()), IsOk());
  EXPECT_EQ(with.mask_token, 7);
  // Only in the vocabulary, under another name.
  std::ofstream(dir_ / "tokenizer_config.json") << R"({"mask_token": {"content": "<mask>"}})";
  std::ofstream(dir_ / "tokenizer.json") << R"({"model": {"vocab": {"<mask>": 5, "a": 1}}})";
  with = m;
  ASSERT_THAT(ResolveMaskToken(&with, dir_.string()), IsOk());
  EXPECT_EQ(with.mask_token, 5);
  // None at all; a given id wins over the tokenizer.
  std::ofstream(dir_ / "tokenizer.json") << R"({"model": {"vocab": {"a": 1}}})";
  with = m;
  EXPECT_THAT(ResolveMaskToken(&with, dir_.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, "has no token '<mask>'"));
  with.mask_token = 3;
  EXPECT_THAT(ResolveMaskToken(&with, dir_.string()), IsOk());
  EXPECT_EQ(with.mask_token, 3);
  // A config of another activation is refused naming it.
  Config(R"({"model_type": "bert", "hidden_act": "relu", "hidden_size": 48,
             "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 300})");
  ModelSpec relu;
  relu.kind = "bert";
  relu.init_from = dir_.string();
  relu.given = {"kind", "init_from"};
  EXPECT_THAT(ResolveInitFrom(&relu),
              StatusIs(absl::StatusCode::kInvalidArgument, "hidden_act is 'relu'"));
}

}  // namespace
}  // namespace varuna

#include "common/spec/job_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

constexpr char kGood[] = R"(
name: tiny
model: {kind: gpt, layers: 2, d_model: 32, heads: 4, seq_len: 16, vocab: 256}
data: {kind: text, path: /etc/hostname}
train: {global_batch: 8, steps: 3, lr: 1e-3, warmup: 1, schedule: cosine, precision: bf16}
parallel: {stages: 2, micro_batch: auto, schedule: 1f1b}
checkpoint: {dir: /tmp/ck, every_steps: 10, keep: 2}
resources: {min_slots: 2, max_slots: 4}
entrypoint: []
env: {FOO: bar}
)";

TEST(JobSpecTest, ParsesAllSections) {
  auto spec = ParseJobSpec(kGood);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name, "tiny");
  EXPECT_EQ(spec->model.layers, 2);
  EXPECT_EQ(spec->train.global_batch, 8);
  EXPECT_EQ(spec->train.precision, "bf16");
  EXPECT_EQ(spec->parallel.stages, 2);
  EXPECT_EQ(spec->parallel.micro_batch, 0);  // auto
  EXPECT_EQ(spec->parallel.schedule, "1f1b");
  EXPECT_EQ(spec->checkpoint.keep, 2);
  EXPECT_EQ(spec->env.at("FOO"), "bar");
}

TEST(JobSpecTest, UnknownKeyIsNamedWithItsPath) {
  std::string text = kGood;
  text += "train2: 1\n";
  EXPECT_THAT(ParseJobSpec(text), StatusIs(absl::StatusCode::kInvalidArgument, "'train2'"));
  auto nested = ParseJobSpec(R"(
data: {kind: text, path: /x}
train: {lrr: 1}
)");
  EXPECT_THAT(nested, StatusIs(absl::StatusCode::kInvalidArgument, "unknown key 'train.lrr'"));
}

TEST(JobSpecTest, TpSizeIsANumberOrAuto) {
  EXPECT_EQ(ParseJobSpec("data: {path: /x}\n")->parallel.tp_size, 1);
  EXPECT_EQ(ParseJobSpec("data: {path: /x}\nparallel: {tp_size: 2}\n")->parallel.tp_size, 2);
  // auto: AutoConfig picks per plan (Note [Tensor-parallel plans]).
  EXPECT_EQ(ParseJobSpec("data: {path: /x}\nparallel: {tp_size: auto}\n")->parallel.tp_size, 0);
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {tp_size: 0}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.tp_size"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {tp_size: many}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be an integer or 'auto'"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {tp_size: 65}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.tp_size"));
  // resources.* count processes: tp_size per stage and replica.
  auto shape = [](const std::string& parallel, const std::string& resources) {
    auto spec =
        ParseJobSpec(absl::StrCat("data: {path: /x}\ntrain: {global_batch: 8}\n",
                                  "parallel: ", parallel, "\nresources: ", resources, "\n"));
    return spec.ok() ? spec->ValidateShape() : spec.status();
  };
  EXPECT_THAT(shape("{stages: 2, replicas: 1, tp_size: 2}", "{min_slots: 4}"), IsOk());
  EXPECT_THAT(shape("{stages: 2, replicas: 2, tp_size: 2}", "{max_slots: 4}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "is 4 but parallel.stages x replicas x tp_size needs at least 8 slots"));
  EXPECT_THAT(shape("{tp_size: 2}", "{max_slots: 1}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "is 1 but parallel.tp_size = 2 needs that many slots for each stage"));
}

TEST(JobSpecTest, DeviceIsAutoCpuOrCuda) {
  for (const char* ok : {"auto", "cpu", "cuda", "cuda:0", "cuda:7"}) {
    auto spec = ParseJobSpec(absl::StrCat("data: {path: /x}\ntrain: {device: '", ok, "'}\n"));
    ASSERT_TRUE(spec.ok()) << ok << ": " << spec.status();
    EXPECT_EQ(spec->train.device, ok);
  }
  EXPECT_EQ(ParseJobSpec("data: {path: /x}\n")->train.device, "auto");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", "cuda:99999"}) {
    EXPECT_THAT(ParseJobSpec(absl::StrCat("data: {path: /x}\ntrain: {device: '", bad, "'}\n")),
                StatusIs(absl::StatusCode::kInvalidArgument, "train.device"))
        << bad;
  }
}

TEST(JobSpecTest, BadValuesAreNamed) {
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ntrain: {lr: -1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "train.lr"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {schedule: zigzag}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "zigzag"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel: {layers: many}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "model.layers"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel: {d_model: 30, heads: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must divide model.d_model"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {dir: /c, resume: newest}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "checkpoint.resume"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {dir: /c, resume: 0}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "step number >= 1, got '0'"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {resume: latest}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs checkpoint.dir"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ncheckpoint: {dir: /c, resume: 40}\n"), IsOk());
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel: {vocab: 100}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "text data is bytes"));
  EXPECT_THAT(ParseJobSpec("model: {kind: gpt}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "data.path"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {stages: -2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.stages"));
  // Sharing: the elastic range and the class's form (which classes exist is the manager's).
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nresources: {min_slots: 4, max_slots: 2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be >= resources.min_slots"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\npriority: \"Urgent!\"\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "priority"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\npriority: [high]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "priority"));
  auto urgent = ParseJobSpec("data: {path: /x}\npriority: urgent\n");
  ASSERT_THAT(urgent.status(), IsOk());
  EXPECT_EQ(urgent->priority, "urgent");
  EXPECT_EQ(ParseJobSpec("data: {path: /x}\n")->priority, "normal");
}

TEST(JobSpecTest, CorpusSourcesParseAndBadOnesAreNamed) {
  auto spec = ParseJobSpec(
      "data: {kind: indexed, eod_token: 0, sample_log: /tmp/log, sources: "
      "[{shards: [/d/a, /d/b], weight: 0.7}, {shards: /d/c, weight: 0.3}]}\n");
  ASSERT_THAT(spec.status(), IsOk());
  ASSERT_EQ(spec->data.sources.size(), 2u);
  EXPECT_EQ(spec->data.sources[0].shards, (std::vector<std::string>{"/d/a", "/d/b"}));
  EXPECT_EQ(spec->data.sources[1].shards, (std::vector<std::string>{"/d/c"}));
  EXPECT_DOUBLE_EQ(spec->data.sources[0].weight, 0.7);
  EXPECT_EQ(spec->data.AllShards().size(), 3u);
  EXPECT_EQ(spec->data.sample_log, "/tmp/log");
  EXPECT_TRUE(spec->data.corpus());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"data: {kind: indexed}\n", "data.sources' is required"},
      {"data: {kind: llmc, path: /x, sources: [{shards: [/a]}]}\n", "data.path' is not used"},
      {"data: {kind: text, path: /x, sources: [{shards: [/a]}]}\n", "is for kind indexed"},
      {"data: {kind: indexed, sources: [{shards: []}]}\n", "data.sources[0].shards' is empty"},
      {"data: {kind: indexed, sources: [{shards: [/a], weight: 0}, {shards: [/b], weight: 0}]}\n",
       "weights sum to zero"},
      {"data: {kind: indexed, sources: [{shards: [/a], weight: -1}]}\n", "data.sources[0].weight"},
      {"data: {kind: indexed, sources: [{shards: [/a], wieght: 1}]}\n",
       "unknown key 'data.sources[0].wieght'"},
      {"data: {kind: indexed, sources: {shards: [/a]}}\n", "must be a list"},
      {"data: {kind: indexed, eod_token: 300, sources: [{shards: [/a]}]}\n",
       "data.eod_token' is 300; model.vocab is 256"},
      {"data: {kind: megatron, sources: [{shards: [/a]}]}\n", "data.kind"},
  };
  for (const auto& [yaml, want] : bad) {
    EXPECT_THAT(ParseJobSpec(yaml), StatusIs(absl::StatusCode::kInvalidArgument, want)) << yaml;
  }
}

// The eval section: data of the same form as data (errors named under eval.data), how
// often, how many samples; observability's TensorBoard directory.
TEST(JobSpecTest, EvalAndObservabilityParseAndBadOnesAreNamed) {
  auto spec = ParseJobSpec(
      "data: {path: /x}\neval: {data: {kind: llmc, sources: [{shards: [/d/val.bin]}]}, "
      "every_steps: 50, "
      "samples: 256}\nobservability: {tensorboard_dir: /runs/tb}\n");
  ASSERT_THAT(spec.status(), IsOk());
  EXPECT_TRUE(spec->eval.enabled);
  EXPECT_EQ(spec->eval.data.kind, "llmc");
  EXPECT_EQ(spec->eval.data.AllShards(), (std::vector<std::string>{"/d/val.bin"}));
  EXPECT_EQ(spec->eval.every_steps, 50);
  EXPECT_EQ(spec->eval.samples, 256);
  EXPECT_EQ(spec->observability.tensorboard_dir, "/runs/tb");
  auto none = ParseJobSpec("data: {path: /x}\n");
  ASSERT_THAT(none.status(), IsOk());
  EXPECT_FALSE(none->eval.enabled);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"eval: {every_steps: 5}\n", "'eval.data' is required"},
      {"eval:\n", "'eval.data' is required"},
      {"eval: {data: {kind: indexed}}\n", "eval.data.sources' is required"},
      {"eval: {data: {kind: indexed, sources: [{shards: [/a], wieght: 1}]}}\n",
       "unknown key 'eval.data.sources[0].wieght'"},
      {"eval: {data: {path: /x, colour: red}}\n", "unknown key 'eval.data.colour'"},
      {"eval: {data: {path: /x}, every_steps: -1}\n", "'eval.every_steps' is -1"},
      {"eval: {data: {path: /x}, samples: 100000000}\n", "'eval.samples' is 100000000"},
      {"eval: {data: {path: /x}, sample: 4}\n", "unknown key 'eval.sample'"},
      {"eval: {data: {path: /x, sample_log: /l}}\n", "eval.data.sample_log' is for the training"},
      {"eval: {data: {kind: tokens, path: /x, dtype: int8}}\n", "eval.data.dtype"},
      {"observability: {tensorboard: /x}\n", "unknown key 'observability.tensorboard'"},
  };
  for (const auto& [yaml, want] : bad) {
    EXPECT_THAT(ParseJobSpec("data: {path: /x}\n" + yaml),
                StatusIs(absl::StatusCode::kInvalidArgument, want))
        << yaml;
  }
  auto missing =
      ParseJobSpec("data: {path: /etc/hostname}\neval: {data: {path: /nonexistent/v}}\n");
  ASSERT_THAT(missing.status(), IsOk());
  EXPECT_THAT(missing->ValidateFiles(), StatusIs(absl::StatusCode::kNotFound, "/nonexistent/v"));
}

absl::Status Shape(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  if (!spec.ok()) return spec.status();
  return spec->ValidateShape();
}

TEST(JobSpecTest, ShapesNoClusterCanRunAreRefused) {
  // Parsing accepts them (a recovering manager must load old rows); ValidateShape refuses.
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nparallel: {stages: 3}\nresources: {max_slots: 2}\n"),
              IsOk());
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 3}\nresources: {max_slots: 2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs at least 3 slots"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2, replicas: 3}\n"
                    "train: {global_batch: 12}\nresources: {max_slots: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs at least 6 slots"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {replicas: 3}\ntrain: {global_batch: 8}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not divisible by parallel.replicas"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2, replicas: 1}\n"
                    "resources: {min_slots: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "resources.min_slots"));
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2, replicas: 2}\n"
                    "train: {global_batch: 8}\nresources: {min_slots: 4, max_slots: 4}\n"),
              IsOk());
  EXPECT_THAT(Shape("data: {path: /x}\nparallel: {stages: 2}\nresources: {min_slots: 4}\n"),
              IsOk());  // replicas auto can grow to min_slots
}

TEST(JobSpecTest, MalformedYaml) {
  EXPECT_THAT(ParseJobSpec("model: {kind: gpt"),
              StatusIs(absl::StatusCode::kInvalidArgument, "malformed YAML"));
  EXPECT_THAT(ParseJobSpec(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ParseJobSpec("- a\n- b\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be a mapping"));
}

// Note [Alias bombs] (common/base/yaml_util.cc): under 1 KB of aliases standing for 10^8
// module names, refused at parse time (the test would not finish otherwise), while aliases
// used honestly still work.
TEST(JobSpecTest, AliasBombIsRefusedWhileParsing) {
  std::string bomb = "x0: &a0 [m, m, m, m, m, m, m, m, m, m]\n";
  for (int level = 1; level <= 8; ++level) {
    bomb += "x" + std::to_string(level) + ": &a" + std::to_string(level) + " [";
    for (int k = 0; k < 10; ++k) bomb += (k ? ", *a" : "*a") + std::to_string(level - 1);
    bomb += "]\n";
  }
  bomb += "parallel: {pipelines: [{stages: [*a8], count: 1}]}\n";
  ASSERT_LT(bomb.size(), 1024u);
  EXPECT_THAT(ParseJobSpec(bomb), StatusIs(absl::StatusCode::kInvalidArgument, "expands"));
  auto honest = ParseJobSpec(
      std::string(kGood).replace(std::string(kGood).find("/etc/hostname"), 13, "&p /etc/hostname") +
      "code_dir: *p\n");
  EXPECT_THAT(honest.status(), IsOk());
}

TEST(JobSpecTest, NamesHoldNoControlCharacters) {
  std::string spec = kGood;
  spec.replace(spec.find("name: tiny"), 10, "name: \"a\\e[2Jb\"");
  EXPECT_THAT(ParseJobSpec(spec), StatusIs(absl::StatusCode::kInvalidArgument, "control"));
}

TEST(JobSpecTest, MissingFiles) {
  EXPECT_THAT(LoadJobSpec("/nonexistent/job.yaml"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/job.yaml"));
  auto spec = ParseJobSpec("data: {path: /nonexistent/data.txt}\n");
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(spec->ValidateFiles(),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/data.txt"));
}

// Issue "Hardening", classes 1, 4 and 5: every member is an error naming the key.
TEST(JobSpecTest, NonScalarAndDuplicateKeysAreErrorsNotCrashes) {
  EXPECT_THAT(ParseJobSpec("? [a, b]\n: 1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a plain name"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nmodel:\n  ? {k: v}\n  : 3\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "a key in 'model'"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ntrain: {lr: 0.1, lr: 0.2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'train.lr' is given twice"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ndata: {path: /y}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'data' is given twice"));
  EXPECT_THAT(ParseJobSpec("data: {path: [a]}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "data.path"));
}

TEST(JobSpecTest, EnvValuesAndKeysAreCheckedNotCoerced) {
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nenv: {A: [1, 2, 3]}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'env.A' must be a single value"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nenv: {'': 1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "env."));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nenv: {'A=B': 1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "env.A=B"));
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\nenv: {A: 1, A: 2}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "given twice"));
  auto ok = ParseJobSpec("data: {path: /x}\nenv: {A: 1, B_2: '', C: x=y}\n");
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->env.at("B_2"), "");
  EXPECT_EQ(ok->env.at("C"), "x=y");
}

TEST(JobSpecTest, EveryNumberHasARange) {
  const std::string base = "data: {path: /x}\n";
  for (const auto& [yaml, key] : std::vector<std::pair<std::string, std::string>>{
           {"model: {seq_len: 2147483647}", "model.seq_len"},
           {"train: {global_batch: 2147483647}", "train.global_batch"},
           {"model: {layers: 100000}", "model.layers"},
           {"train: {lr: .inf}", "train.lr"},
           {"train: {lr: .nan}", "train.lr"},
           {"parallel: {timeout_s: .inf}", "parallel.timeout_s"},
           {"train: {steps: 99999999999}", "train.steps"},
           {"train: {clip_grad_norm: .inf}", "train.clip_grad_norm"},
           {"model: {dropout: .nan}", "model.dropout"},
           {"train: {init_loss_scale: .inf}", "train.init_loss_scale"},
           {"resources: {min_slots: 99999999}", "resources.min_slots"},
           {"checkpoint: {every_steps: -1}", "checkpoint.every_steps"},
       }) {
    EXPECT_THAT(ParseJobSpec(base + yaml + "\n"), StatusIs(absl::StatusCode::kInvalidArgument, key))
        << yaml;
  }
}

TEST(JobSpecTest, MicroBatchLargerThanTheReplicaBatchIsAnError) {
  EXPECT_THAT(ParseJobSpec("data: {path: /x}\ntrain: {global_batch: 8}\n"
                           "parallel: {micro_batch: 16}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "parallel.micro_batch"));
  auto spec = ParseJobSpec(
      "data: {path: /x}\ntrain: {global_batch: 8}\n"
      "parallel: {micro_batch: 8, replicas: 2}\n");
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(spec->ValidateShape(),
              StatusIs(absl::StatusCode::kInvalidArgument, "per-replica batch (4"));
}

TEST(JobSpecTest, FilesMustBeRegularAndChecksNeverBlock) {
  const std::string dir = ::testing::TempDir() + "/spec_fifo_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto spec = ParseJobSpec("data: {path: " + fifo + "}\n");
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(spec->ValidateFiles(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a regular file"));
  auto dev = ParseJobSpec("data: {path: /dev/zero}\n");
  EXPECT_THAT(dev->ValidateFiles(), StatusIs(absl::StatusCode::kInvalidArgument, "data.path"));
  EXPECT_THAT(LoadJobSpec(fifo), StatusIs(absl::StatusCode::kInvalidArgument, "regular file"));
  EXPECT_THAT(ParseJobSpec(std::string(2 << 20, '#')),
              StatusIs(absl::StatusCode::kInvalidArgument, "limit"));
  std::filesystem::remove_all(dir);
}

// A spec with `stragglers:` set to `block` (a flow mapping).
absl::StatusOr<JobSpec> WithStragglers(const std::string& block) {
  return ParseJobSpec(absl::StrCat("data: {path: /x}\nstragglers: ", block, "\n"));
}

TEST(StragglerSpecTest, FullBlockParses) {
  auto spec = WithStragglers(
      "{policy: report, slow_below: 0.7, window_steps: 9, min_gain: 0, probation_s: 300, "
      "recovered_above: 0.95}");
  ASSERT_THAT(spec, IsOk());
  const StragglerSpec& s = spec->stragglers;
  EXPECT_EQ(s.policy, "report");
  EXPECT_EQ(s.slow_below, 0.7);
  EXPECT_EQ(s.window_steps, 9);
  EXPECT_EQ(s.min_gain, 0);  // 0 is a value here, not "unset"
  EXPECT_EQ(s.probation_s, 300);
  EXPECT_EQ(s.recovered_above, 0.95);
  EXPECT_THAT(WithStragglers("{policy: 'off'}"), IsOk());
  EXPECT_THAT(WithStragglers("{policy: off}"), IsOk());  // a plain string to yaml-cpp
  EXPECT_THAT(WithStragglers("{policy: auto, recovered_above: 1}"), IsOk());
}

TEST(StragglerSpecTest, UnsetFieldsTakeTheDefaults) {
  const StragglerSpec defaults{"auto", 0.8, 5, 0.05, 120, 0.9};
  auto none = ParseJobSpec("data: {path: /x}\n");
  ASSERT_THAT(none, IsOk());
  const StragglerSpec& u = none->stragglers;
  EXPECT_EQ(u.policy, "");
  EXPECT_EQ(u.slow_below, 0);
  EXPECT_EQ(u.window_steps, 0);
  EXPECT_LT(u.min_gain, 0);
  EXPECT_EQ(u.probation_s, 0);
  EXPECT_EQ(u.recovered_above, 0);
  EXPECT_THAT(ValidateStragglers(u, "stragglers", false), IsOk());
  const StragglerSpec all = ResolveStragglers(u, defaults);
  EXPECT_EQ(all.policy, "auto");
  EXPECT_EQ(all.slow_below, 0.8);
  EXPECT_EQ(all.window_steps, 5);
  EXPECT_EQ(all.min_gain, 0.05);
  EXPECT_EQ(all.probation_s, 120);
  EXPECT_EQ(all.recovered_above, 0.9);
  EXPECT_THAT(ValidateStragglers(all, "x", true), IsOk());

  auto some = WithStragglers("{policy: report, window_steps: 20, min_gain: 0}");
  ASSERT_THAT(some, IsOk());
  const StragglerSpec mixed = ResolveStragglers(some->stragglers, defaults);
  EXPECT_EQ(mixed.policy, "report");
  EXPECT_EQ(mixed.slow_below, 0.8);
  EXPECT_EQ(mixed.window_steps, 20);
  EXPECT_EQ(mixed.min_gain, 0);
  EXPECT_EQ(mixed.probation_s, 120);
  EXPECT_EQ(mixed.recovered_above, 0.9);
  EXPECT_THAT(WithStragglers("{}"), IsOk());
  EXPECT_THAT(WithStragglers(""), IsOk());  // null: nothing set
}

TEST(StragglerSpecTest, EveryBoundIsCheckedAndNamed) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{slow_below: 0}", "stragglers.slow_below"},
      {"{slow_below: 1}", "stragglers.slow_below"},
      {"{slow_below: 1.5}", "stragglers.slow_below"},
      {"{slow_below: -1}", "stragglers.slow_below"},
      {"{slow_below: .nan}", "stragglers.slow_below"},
      {"{slow_below: .inf}", "stragglers.slow_below"},
      {"{window_steps: 1}", "stragglers.window_steps"},
      {"{window_steps: 1001}", "stragglers.window_steps"},
      {"{window_steps: 0}", "stragglers.window_steps"},
      {"{window_steps: 2.5}", "stragglers.window_steps"},
      {"{min_gain: 1}", "stragglers.min_gain"},
      {"{min_gain: -0.5}", "stragglers.min_gain"},
      {"{min_gain: .nan}", "stragglers.min_gain"},
      {"{probation_s: 0.5}", "stragglers.probation_s"},
      {"{probation_s: 604801}", "stragglers.probation_s"},
      {"{probation_s: -.inf}", "stragglers.probation_s"},
      {"{recovered_above: 0}", "stragglers.recovered_above"},
      {"{recovered_above: 1.2}", "stragglers.recovered_above"},
      {"{recovered_above: .nan}", "stragglers.recovered_above"},
      {"{slow_below: 0.8, recovered_above: 0.8}", "stragglers.recovered_above (0.8) must be"},
      {"{slow_below: 0.8, recovered_above: 0.5}", "greater than stragglers.slow_below"},
      {"{policy: maybe}", "stragglers.policy must be auto, report or off, not 'maybe'"},
      {"{policy: ''}", "stragglers.policy"},
      {"{policy: [auto]}", "stragglers.policy"},
      {"{speed: 1}", "unknown key 'stragglers.speed'"},
      {"{slow_below: 0.5, slow_below: 0.6}", "given twice"},
      {"5", "'stragglers' must be a mapping"},
  };
  for (const auto& [block, needle] : bad) {
    EXPECT_THAT(WithStragglers(block), StatusIs(absl::StatusCode::kInvalidArgument, needle))
        << block;
  }
  // The range is in the message, and the struct is checked the same way without the parser.
  EXPECT_THAT(WithStragglers("{slow_below: 1.5}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be a finite number in (0, 1)"));
  JobSpec spec;
  spec.data.path = "/x";
  spec.stragglers.window_steps = 1001;
  EXPECT_THAT(spec.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "job spec: stragglers.window_steps"));
  StragglerSpec unset;
  EXPECT_THAT(ValidateStragglers(unset, "manager config stragglers", true),
              StatusIs(absl::StatusCode::kInvalidArgument, "manager config stragglers.policy"));
  unset.policy = "auto";
  EXPECT_THAT(ValidateStragglers(unset, "manager config stragglers", true),
              StatusIs(absl::StatusCode::kInvalidArgument, "manager config stragglers.slow_below"));
}

}  // namespace
}  // namespace varuna

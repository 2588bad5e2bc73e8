// The Planning group's data command: what a job's steps read from its corpus (docs/data.md).

#include <algorithm>
#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/data/corpus.h"
#include "common/data/manifest.h"
#include "common/spec/job_spec.h"
#include "common/spec/submission.h"
#include "ctl/commands.h"
#include "ctl/session.h"
#include "ctl/varunactl.h"

namespace varuna::ctl {
namespace {

absl::StatusOr<int64_t> Count(const ParsedArgs& a, const std::string& flag, int64_t fallback,
                              int64_t lo) {
  if (!a.Has(flag)) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(a.Value(flag), &v) || v < lo) {
    return UsageError(absl::StrCat(flag, " must be an integer >= ", lo));
  }
  return v;
}

absl::StatusOr<int> RunData(Session& s, const ParsedArgs& a) {
  ASSIGN_OR_RETURN(const int64_t steps, Count(a, "--steps", 1, 1));
  ASSIGN_OR_RETURN(const int64_t from, Count(a, "--from", 1, 1));
  ASSIGN_OR_RETURN(const int64_t show, Count(a, "--tokens", 8, 0));
  if (steps > 10000) return UsageError("--steps: at most 10000");
  SubmitOptions opts;  // check_files: the shards and their manifests are checked here
  opts.sets = a.Values("--set");
  auto yaml = PrepareSubmission(a.Get("FILE"), opts);
  if (!yaml.ok()) return absl::InvalidArgumentError(yaml.status().message());
  auto spec = ParseJobSpec(*yaml);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  const DataSpec& d = spec->data;
  if (!d.corpus()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.kind is ", d.kind,
                     ": its samples are windows at hashed offsets (docs/data.md); "
                     "varunactl data shows corpora (kind indexed or llmc)"));
  }
  CorpusOptions o;
  o.kind = d.kind;
  for (const DataSource& src : d.sources) o.sources.push_back({src.shards, src.weight});
  o.seq_len = spec->model.seq_len;
  o.vocab = spec->model.vocab;
  o.seed = spec->train.seed;
  auto corpus = Corpus::Open(o);
  if (!corpus.ok()) return corpus.status();
  const int64_t B = spec->train.global_batch;
  StreamPosition pos = (*corpus)->PositionAt((from - 1) * B);
  std::ostream& out = s.out();
  if (!s.json()) {
    out << "corpus " << (*corpus)->Fingerprint() << " (" << d.kind << ", seq_len " << o.seq_len
        << ", seed " << o.seed << ")\n";
    for (int i = 0; i < (*corpus)->num_sources(); ++i) {
      out << absl::StrFormat(
          "  source %d: weight %g, %d shard(s), %d tokens, %d samples an epoch\n", i,
          d.sources[i].weight, d.sources[i].shards.size(), (*corpus)->tokens(i),
          (*corpus)->samples(i));
    }
    out << "STEP  SOURCE  EPOCH  SAMPLE  TOKENS\n";
  } else {
    out << "[";
  }
  std::vector<int64_t> tokens(o.seq_len + 1);
  bool first = true;
  for (int64_t step = from; step < from + steps; ++step) {
    for (const SampleRef& r : (*corpus)->Next(&pos, B)) {
      RETURN_IF_ERROR((*corpus)->Tokens(r, tokens.data()));
      const int64_t n = show == 0 ? o.seq_len + 1 : std::min<int64_t>(show, o.seq_len + 1);
      const std::string ids = absl::StrJoin(tokens.begin(), tokens.begin() + n, ", ");
      if (s.json()) {
        out << (first ? "\n" : ",\n")
            << absl::StrFormat(
                   "{\"step\": %d, \"source\": %d, \"epoch\": %d, \"sample\": %d, "
                   "\"tokens\": [%s]}",
                   step, r.source, r.epoch, r.sample, ids);
      } else {
        out << absl::StrFormat("%-5d %-7d %-6d %-7d %s%s\n", step, r.source, r.epoch, r.sample, ids,
                               n < o.seq_len + 1 ? ", ..." : "");
      }
      first = false;
    }
  }
  if (s.json()) out << "\n]\n";
  return kExitOk;
}

}  // namespace

Command NewCmdData() {
  Command c;
  c.name = "data";
  c.group = kGroupPlanning;
  c.synopsis = "the samples a job's steps read from its corpus";
  c.help =
      "Opens the job's corpus here (data.kind indexed or llmc: its shards and their\n"
      "manifests are checked as varunactl submit does) and prints, for each step asked, every\n"
      "sample of its global batch in stream order: its source, that source's epoch, the\n"
      "sample's index in the source, and its first tokens. The stream is what the job trains\n"
      "on at any P x D (docs/data.md \"Corpora\").\n"
      "\n"
      "Examples:\n"
      "  varunactl data job.yaml\n"
      "  varunactl data job.yaml --from 1000 --steps 2 --tokens 0 -o json\n";
  c.args = {Arg("FILE", "job FILE")};
  c.flags = {
      Option("--steps", "N", "steps to show (default 1)"),
      Option("--from", "STEP", "the first step to show (default 1)"),
      Option("--tokens", "K", "tokens shown per sample (default 8; 0 = all seq_len + 1)"),
      Repeated("--set", "KEY=VALUE", "set a spec field by its dotted name (the value is YAML)"),
  };
  c.manager = ManagerUse::kNone;
  c.run = RunData;
  return c;
}

}  // namespace varuna::ctl

#pragma once

// What the model saw (docs/data.md "The sample log"): with data.sample_log: DIR, the rank that
// feeds samples into its pipeline (stage 0, tp rank 0) appends to DIR/rank-R.gen-G.jsonl one
// JSON line per sample of every step it applies, {"step", "source", "sample", "epoch"}, after a
// first line {"generation": G, "resumed_from": S}.
//
// Note [Sample log]: a step's lines are written when this rank has applied the step (in
// training, or when a morph in place's hand-over rolls it forward through one: then into the
// old generation's file, with the old slice). A morph keeps at most the step in flight from
// being committed (Note [Committed step] in worker/engine/varuna.cc), and the next generation
// re-runs it with the same samples: such a step is in two generations' files. The rule that
// reads the log exactly: a line of generation G for step s counts unless a later generation
// resumed from a step before s (tests/e2e/corpus_e2e.py and varuna-data seen apply it). Not
// covered: a feeding rank that dies (or, on the relaunch path, exits) one step behind peers
// that completed that step (a split, issue 24) never logs its slice of it. No LibTorch.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/data/corpus.h"

namespace varuna {

class SampleLog {
 public:
  SampleLog() = default;
  ~SampleLog();
  SampleLog(const SampleLog&) = delete;
  SampleLog& operator=(const SampleLog&) = delete;

  // Starts DIR/rank-R.gen-G.jsonl (creating DIR) with its first line; a log already open for
  // another generation is closed.
  absl::Status Open(const std::string& dir, int rank, int generation, int64_t resumed_from);
  bool open() const { return file_ != nullptr; }
  int generation() const { return generation_; }
  // The newest step logged (the generation's resumed_from before its first).
  int64_t last_step() const { return last_step_; }
  // One line per sample of `step`, flushed to the kernel (a crash after it loses nothing).
  // `extra`, when not empty, holds one JSON fragment per sample appended to its record (a
  // masked LM's `"input_ids": [...], "labels": [...]`).
  absl::Status Append(int64_t step, const std::vector<SampleRef>& refs,
                      const std::vector<std::string>& extra = {});

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  int generation_ = -1;
  int64_t last_step_ = 0;
};

}  // namespace varuna

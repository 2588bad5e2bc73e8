#pragma once

// What varunactl does to a job file before it sends it: field overrides, paths made
// absolute, the env_file merged, and the result validated, so a bad spec is refused on the
// user's terminal with the problem named and nothing is queued. Also the two small text
// formats users bring from Varuna: env files and experiment (--configs) files.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace varuna {

struct SubmitOptions {
  // "a.b=value" assignments; value is read as YAML (numbers, lists like [a, b], 'auto').
  std::vector<std::string> sets;
  // KEY=VALUE pairs added to env (win over env_file and the spec's env:).
  std::vector<std::string> env;
  std::string env_file;                 // overrides the spec's env_file
  std::vector<std::string> entrypoint;  // non-empty: replaces the spec's entrypoint
  bool check_files = true;              // data.path etc. must be readable here
};

// Reads `path`, applies `opts` and returns the validated spec as YAML text. Relative
// data.path, model.path, checkpoint.dir and env_file are resolved against the job file's
// directory. Errors name the file and the problem.
absl::StatusOr<std::string> PrepareSubmission(const std::string& path, const SubmitOptions& opts);

// Parses KEY=VALUE lines (optional `export `, # comments, blank lines, quoted values).
absl::StatusOr<std::map<std::string, std::string>> ParseEnvFile(const std::string& text,
                                                                const std::string& name);

// Splits an experiment file into commands: one per entry, a trailing `\` continues the
// line, `#` starts a comment line; words split like a shell (quotes, backslashes).
absl::StatusOr<std::vector<std::vector<std::string>>> ParseExperimentFile(const std::string& text,
                                                                          const std::string& name);

// Splits one command line into words like a POSIX shell (no expansion).
absl::StatusOr<std::vector<std::string>> SplitCommandLine(const std::string& line);

// Reads a whole file; NotFound naming it.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);

}  // namespace varuna

#include "common/spec/submission.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/base/yaml_util.h"
#include "common/spec/job_spec.h"

namespace varuna {
namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::pair<std::string, std::string>> SplitAssignment(const std::string& text,
                                                                    const std::string& what) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' is not KEY=VALUE"));
  }
  return std::make_pair(text.substr(0, eq), text.substr(eq + 1));
}

// Sets root[a][b]... = value for "a.b". Creates maps on the way; refuses to descend into
// a non-map.
absl::Status SetPath(YAML::Node root, const std::string& dotted, const std::string& value) {
  std::vector<std::string> parts = absl::StrSplit(dotted, '.');
  for (const std::string& part : parts) {
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", dotted, ": empty key (expected section.key=value)"));
    }
  }
  auto loaded = ParseYaml(value, absl::StrCat("--set ", dotted));
  if (!loaded.ok()) return loaded.status();
  YAML::Node parsed = *loaded;
  if (value.empty()) parsed = YAML::Node(std::string());
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node child = chain.back()[parts[i]];
    if (child.IsDefined() && !child.IsNull() && !child.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", dotted, ": '", parts[i], "' is not a mapping"));
    }
    if (!child.IsDefined() || child.IsNull()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child = chain.back()[parts[i]];
    }
    chain.push_back(child);
  }
  chain.back()[parts.back()] = parsed;
  return absl::OkStatus();
}

std::string Absolute(const std::string& p, const fs::path& base) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (base / p).lexically_normal().string();
}

void AbsolutizeKey(YAML::Node root, const std::string& section, const std::string& key,
                   const fs::path& base) {
  // A section that is not a mapping is left for ParseJobSpec to name (operator[] on a
  // scalar would throw).
  if (!section.empty() && !(root[section].IsDefined() && root[section].IsMap())) return;
  YAML::Node node = section.empty() ? root[key] : root[section][key];
  if (!node.IsDefined() || !node.IsScalar()) return;
  const std::string abs = Absolute(node.Scalar(), base);
  if (section.empty()) {
    root[key] = abs;
  } else {
    root[section][key] = abs;
  }
}

// A data section's paths (data, eval.data): path, tokenizer_dir, sample_log and
// sources[].shards[] made absolute (a scalar shard list too).
void AbsolutizeData(YAML::Node data, const fs::path& base) {
  if (!(data.IsDefined() && data.IsMap())) return;
  for (const char* key : {"path", "tokenizer_dir", "sample_log"})
    AbsolutizeKey(data, "", key, base);
  YAML::Node sources = data["sources"];
  if (!sources.IsDefined() || !sources.IsSequence()) return;
  for (size_t i = 0; i < sources.size(); ++i) {
    YAML::Node src = sources[i];
    if (!src.IsMap()) continue;
    YAML::Node shards = src["shards"];
    if (shards.IsScalar()) {
      src["shards"] = Absolute(shards.Scalar(), base);
    } else if (shards.IsSequence()) {
      for (size_t j = 0; j < shards.size(); ++j) {
        if (shards[j].IsScalar()) shards[j] = Absolute(shards[j].Scalar(), base);
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  return ReadRegularFile(path, kMaxJobSpecBytes, what);
}

absl::StatusOr<std::map<std::string, std::string>> ParseEnvFile(const std::string& text,
                                                                const std::string& name) {
  std::map<std::string, std::string> env;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    std::string line(absl::StripAsciiWhitespace(raw));
    if (line.empty() || line[0] == '#') continue;
    if (absl::StartsWith(line, "export "))
      line = std::string(absl::StripAsciiWhitespace(line.substr(7)));
    const size_t eq = line.find('=');
    const std::string key = eq == std::string::npos ? line : line.substr(0, eq);
    if (eq == std::string::npos || !IsValidEnvKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("env file ", name, " line ", line_no, ": '", line, "' is not KEY=VALUE"));
    }
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    env[key] = value;
  }
  return env;
}

absl::StatusOr<std::vector<std::string>> SplitCommandLine(const std::string& line) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        cur += c;
      }
    } else if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' && i + 1 < line.size() &&
                 (line[i + 1] == '"' || line[i + 1] == '\\' || line[i + 1] == '$')) {
        cur += line[++i];
      } else {
        cur += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < line.size()) {
      cur += line[++i];
      in_word = true;
    } else if (absl::ascii_isspace(c)) {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (quote != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unterminated ", std::string(1, quote), " quote in '", line, "'"));
  }
  if (in_word) words.push_back(cur);
  return words;
}

absl::StatusOr<std::vector<std::vector<std::string>>> ParseExperimentFile(const std::string& text,
                                                                          const std::string& name) {
  std::vector<std::vector<std::string>> commands;
  std::string pending;
  int start_line = 0;
  int line_no = 0;
  auto flush = [&]() -> absl::Status {
    const std::string cmd(absl::StripAsciiWhitespace(pending));
    pending.clear();
    if (cmd.empty()) return absl::OkStatus();
    auto words = SplitCommandLine(cmd);
    if (!words.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("configs file ", name, " line ", start_line,
                                                     ": ", words.status().message()));
    }
    commands.push_back(*std::move(words));
    return absl::OkStatus();
  };
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    std::string line(absl::StripTrailingAsciiWhitespace(raw));
    const bool continuing = !pending.empty();
    if (!continuing) {
      const absl::string_view stripped = absl::StripLeadingAsciiWhitespace(line);
      if (stripped.empty() || stripped[0] == '#') continue;
      start_line = line_no;
    }
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      pending += line + " ";
      continue;
    }
    pending += line;
    RETURN_IF_ERROR(flush());
  }
  RETURN_IF_ERROR(flush());
  if (commands.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("configs file ", name, " has no commands"));
  }
  return commands;
}

namespace {

absl::StatusOr<std::string> Prepare(const std::string& path, const SubmitOptions& opts) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "job file"));
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  auto loaded = ParseYaml(text, absl::StrCat(path, ": job spec"));
  if (!loaded.ok()) return loaded.status();
  YAML::Node root = *loaded;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": job spec: must be a YAML mapping"));
  }
  for (const std::string& set : opts.sets) {
    auto kv = SplitAssignment(set, "--set");
    if (!kv.ok()) return fail(kv.status());
    absl::Status s = SetPath(root, kv->first, kv->second);
    if (!s.ok()) return fail(s);
  }
  if (!opts.entrypoint.empty()) root["entrypoint"] = opts.entrypoint;
  if (!opts.env_file.empty()) root["env_file"] = opts.env_file;

  const fs::path base = fs::absolute(fs::path(path)).parent_path();
  AbsolutizeKey(root, "model", "path", base);
  AbsolutizeKey(root, "model", "init_from", base);
  AbsolutizeData(root["data"], base);
  if (root["eval"].IsDefined() && root["eval"].IsMap()) AbsolutizeData(root["eval"]["data"], base);
  AbsolutizeKey(root, "observability", "tensorboard_dir", base);
  AbsolutizeKey(root, "checkpoint", "dir", base);
  AbsolutizeKey(root, "", "env_file", base);

  // env_file first, the spec's env: over it, --env over both.
  std::map<std::string, std::string> env;
  if (root["env_file"].IsDefined() && root["env_file"].IsScalar() &&
      !root["env_file"].Scalar().empty()) {
    const std::string env_path = root["env_file"].Scalar();
    ASSIGN_OR_RETURN(std::string env_text, ReadRegularFile(env_path, kMaxEnvFileBytes, "env_file"));
    ASSIGN_OR_RETURN(env, ParseEnvFile(env_text, env_path));
    root.remove("env_file");
  }
  if (root["env"].IsDefined() && !root["env"].IsNull()) {
    RETURN_IF_ERROR(ForEachEntry(
        root["env"], absl::StrCat(path, ": job spec"), "env",
        [&](const std::string& key, const YAML::Node& v) -> absl::Status {
          if (!IsValidEnvKey(key)) {
            return absl::InvalidArgumentError(
                absl::StrCat(path, ": job spec: 'env.", key, "' is not a valid variable name"));
          }
          ASSIGN_OR_RETURN(
              env[key], YamlScalar(v, absl::StrCat(path, ": job spec"), absl::StrCat("env.", key)));
          return absl::OkStatus();
        }));
  }
  for (const std::string& e : opts.env) {
    ASSIGN_OR_RETURN(auto kv, SplitAssignment(e, "--env"));
    if (!IsValidEnvKey(kv.first)) {
      return absl::InvalidArgumentError(absl::StrCat("--env '", e, "': bad variable name"));
    }
    env[kv.first] = kv.second;
  }
  if (!env.empty()) {
    YAML::Node env_node(YAML::NodeType::Map);
    for (const auto& [k, v] : env) env_node[k] = v;
    root["env"] = env_node;
  }

  YAML::Emitter out;
  out << root;
  std::string yaml = out.c_str();
  auto spec = ParseJobSpec(yaml);
  if (!spec.ok()) return fail(spec.status());
  // model.init_from: the architecture comes from DIR/config.json here, where the directory
  // is, and travels in the spec (the manager plans with it; the worker checks it again).
  if (opts.check_files && !spec->model.init_from.empty()) {
    if (absl::Status s = ResolveInitFrom(&spec->model); !s.ok()) return fail(s);
    for (const auto& [key, value] : ArchitectureKeys(spec->model)) root["model"][key] = value;
    YAML::Emitter resolved;
    resolved << root;
    yaml = resolved.c_str();
    spec = ParseJobSpec(yaml);
    if (!spec.ok()) return fail(spec.status());
  }
  if (absl::Status s = spec->ValidateShape(); !s.ok()) return fail(s);
  if (opts.check_files) {
    absl::Status s = spec->ValidateFiles();
    if (!s.ok()) return fail(s);
  }
  return yaml;
}

}  // namespace

absl::StatusOr<std::string> PrepareSubmission(const std::string& path, const SubmitOptions& opts) {
  // Note [Parser boundary]: yaml-cpp throws from operator[] on a scalar, from conversions and
  // from the emitter. Every such path above is checked, and this is the backstop: no
  // exception leaves a function that reads outside input.
  try {
    return Prepare(path, opts);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": job spec: cannot be read: ", e.what()));
  }
}

}  // namespace varuna

#include "common/submission.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "common/status_macros.h"

namespace varuna {
namespace fs = std::filesystem;

namespace {

bool ValidEnvKey(absl::string_view key) {
  if (key.empty() || absl::ascii_isdigit(key[0])) return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

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
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", dotted, "=", value, ": value is not valid YAML"));
  }
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
  YAML::Node node = section.empty() ? root[key] : root[section][key];
  if (!node.IsDefined() || !node.IsScalar()) return;
  const std::string abs = Absolute(node.Scalar(), base);
  if (section.empty()) {
    root[key] = abs;
  } else {
    root[section][key] = abs;
  }
}

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(what, " '", path, "' cannot be read"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
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
    if (eq == std::string::npos || !ValidEnvKey(key)) {
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

absl::StatusOr<std::string> PrepareSubmission(const std::string& path, const SubmitOptions& opts) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "job file"));
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": job spec: malformed YAML: ", e.what()));
  }
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
  AbsolutizeKey(root, "data", "path", base);
  AbsolutizeKey(root, "model", "path", base);
  AbsolutizeKey(root, "checkpoint", "dir", base);
  AbsolutizeKey(root, "", "env_file", base);

  // env_file first, the spec's env: over it, --env over both.
  std::map<std::string, std::string> env;
  if (root["env_file"].IsDefined() && root["env_file"].IsScalar() &&
      !root["env_file"].Scalar().empty()) {
    const std::string env_path = root["env_file"].Scalar();
    ASSIGN_OR_RETURN(std::string env_text, ReadTextFile(env_path, "env_file"));
    ASSIGN_OR_RETURN(env, ParseEnvFile(env_text, env_path));
    root.remove("env_file");
  }
  if (root["env"].IsDefined() && root["env"].IsMap()) {
    for (const auto& kv : root["env"]) env[kv.first.Scalar()] = kv.second.Scalar();
  }
  for (const std::string& e : opts.env) {
    ASSIGN_OR_RETURN(auto kv, SplitAssignment(e, "--env"));
    if (!ValidEnvKey(kv.first)) {
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
  const std::string yaml = out.c_str();
  auto spec = ParseJobSpec(yaml);
  if (!spec.ok()) return fail(spec.status());
  if (absl::Status s = spec->ValidateShape(); !s.ok()) return fail(s);
  if (opts.check_files) {
    absl::Status s = spec->ValidateFiles();
    if (!s.ok()) return fail(s);
  }
  return yaml;
}

}  // namespace varuna

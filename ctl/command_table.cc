#include "ctl/command_table.h"

#include <algorithm>
#include <ostream>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace varuna::ctl {
namespace {

constexpr char kUsagePayload[] = "type.varuna.dev/varunactl.UsageError";
constexpr size_t kWidth = 100;

const Flag* FindFlag(absl::string_view name, const std::vector<const Flag*>& flags) {
  for (const Flag* f : flags) {
    if (name == f->name || (!f->short_name.empty() && name == f->short_name)) return f;
  }
  return nullptr;
}

// "-o, --output FORMAT"
std::string FlagLabel(const Flag& f) {
  std::string label = f.short_name.empty() ? f.name : absl::StrCat(f.short_name, ", ", f.name);
  if (!f.value_name.empty()) absl::StrAppend(&label, " ", f.value_name);
  return label;
}

// Writes `text` wrapped to kWidth columns: the first line after `indent` columns already
// written, the others indented by `indent` spaces.
void PrintWrapped(std::ostream& os, absl::string_view text, size_t indent) {
  size_t column = indent;
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && column + 1 + word.size() > kWidth) {
      os << "\n" << std::string(indent, ' ');
      column = indent;
      first = true;
    }
    if (!first) {
      os << ' ';
      ++column;
    }
    os << word;
    column += word.size();
    first = false;
  }
  os << "\n";
}

void PrintFlags(std::ostream& os, const std::vector<Flag>& flags) {
  size_t width = 0;
  for (const Flag& f : flags) width = std::max(width, FlagLabel(f).size());
  for (const Flag& f : flags) {
    const std::string label = FlagLabel(f);
    os << "  " << label << std::string(width - label.size() + 2, ' ');
    std::string help = f.help;
    if (!f.default_value.empty()) absl::StrAppend(&help, " (default: ", f.default_value, ")");
    if (f.repeated) absl::StrAppend(&help, "; repeatable");
    PrintWrapped(os, help, width + 4);
  }
}

std::string UsageLine(const Command& c) {
  std::vector<std::string> parts = {"usage: varunactl", c.name};
  for (const Arg& a : c.args) parts.push_back(a.optional ? absl::StrCat("[", a.name, "]") : a.name);
  if (!c.flags.empty()) parts.push_back("[flags]");
  if (!c.passthrough_name.empty()) parts.push_back(absl::StrCat("[-- ", c.passthrough_name, "]"));
  return absl::StrJoin(parts, " ");
}

}  // namespace

Flag Switch(std::string name, std::string help, std::string short_name) {
  Flag f;
  f.name = std::move(name);
  f.short_name = std::move(short_name);
  f.help = std::move(help);
  return f;
}

Flag Option(std::string name, std::string value_name, std::string help, std::string default_value,
            std::string short_name) {
  Flag f = Switch(std::move(name), std::move(help), std::move(short_name));
  f.value_name = std::move(value_name);
  f.default_value = std::move(default_value);
  return f;
}

Flag Repeated(std::string name, std::string value_name, std::string help) {
  Flag f = Option(std::move(name), std::move(value_name), std::move(help));
  f.repeated = true;
  return f;
}

std::string ParsedArgs::Value(const std::string& flag) const {
  auto it = flags_.find(flag);
  if (it != flags_.end() && !it->second.empty()) return it->second.back();
  auto d = defaults_.find(flag);
  return d == defaults_.end() ? "" : d->second;
}

std::vector<std::string> ParsedArgs::Values(const std::string& flag) const {
  auto it = flags_.find(flag);
  return it == flags_.end() ? std::vector<std::string>() : it->second;
}

std::string ParsedArgs::Get(const std::string& arg) const {
  auto it = args_.find(arg);
  return it == args_.end() ? "" : it->second;
}

absl::Status UsageError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kUsagePayload, absl::Cord("1"));
  return s;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") return false;
    if (a == "-h" || a == "--help") return true;
  }
  return false;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<Flag>& global_flags,
                                     const Command& command) {
  ParsedArgs parsed;
  std::vector<const Flag*> flags;
  for (const Flag& f : command.flags) flags.push_back(&f);
  for (const Flag& f : global_flags) flags.push_back(&f);
  for (const Flag* f : flags) {
    if (!f->default_value.empty()) parsed.defaults_[f->name] = f->default_value;
  }
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      if (command.passthrough_name.empty()) return UsageError("unexpected argument '--'");
      parsed.passthrough_.assign(args.begin() + i + 1, args.end());
      break;
    }
    if (a.empty() || a[0] != '-') {
      positional.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const Flag* f = FindFlag(name, flags);
    if (f == nullptr) {
      return UsageError(absl::StrCat("unknown flag '", name, "' for '", command.name, "'"));
    }
    if (!f->repeated && parsed.flags_.count(f->name) > 0) {
      return UsageError(absl::StrCat(name, " given more than once"));
    }
    std::string value;
    if (f->value_name.empty()) {
      if (eq != std::string::npos) return UsageError(absl::StrCat(name, " takes no value"));
    } else if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError(absl::StrCat(name, " needs a value"));
    }
    parsed.flags_[f->name].push_back(std::move(value));
  }
  size_t next = 0;
  for (const Arg& arg : command.args) {
    if (next < positional.size()) {
      parsed.args_[arg.name] = positional[next++];
    } else if (!arg.optional) {
      return UsageError(absl::StrCat("missing ", arg.what));
    }
  }
  if (next < positional.size()) {
    return UsageError(absl::StrCat("unexpected argument '", positional[next], "'"));
  }
  return parsed;
}

void PrintCommandList(std::ostream& os, const std::vector<Command>& commands,
                      const std::vector<std::string>& groups, const std::vector<Flag>& global_flags,
                      absl::string_view epilogue) {
  std::vector<std::string> order = groups;
  for (const Command& c : commands) {
    if (std::find(order.begin(), order.end(), c.group) == order.end()) order.push_back(c.group);
  }
  size_t width = 0;
  for (const Command& c : commands) width = std::max(width, c.name.size());
  os << "usage: varunactl [global flags] COMMAND [ARGS] [flags]\n";
  for (const std::string& group : order) {
    bool heading = false;
    for (const Command& c : commands) {
      if (c.group != group) continue;
      if (!heading) os << "\n" << group << ":\n";
      heading = true;
      os << "  " << c.name << std::string(width - c.name.size() + 2, ' ');
      std::string synopsis = c.synopsis;
      if (!c.aliases.empty()) {
        absl::StrAppend(&synopsis, " (alias: ", absl::StrJoin(c.aliases, ", "), ")");
      }
      PrintWrapped(os, synopsis, width + 4);
    }
  }
  os << "\nGlobal flags (every command):\n";
  PrintFlags(os, global_flags);
  os << "\n" << epilogue;
}

void PrintCommandHelp(std::ostream& os, const Command& command,
                      const std::vector<Flag>& global_flags) {
  os << "varunactl " << command.name << ": " << command.synopsis << "\n\n"
     << UsageLine(command) << "\n\n"
     << command.help;
  if (!command.aliases.empty()) {
    os << "\nAliases: " << absl::StrJoin(command.aliases, ", ") << "\n";
  }
  if (!command.flags.empty()) {
    os << "\nFlags:\n";
    PrintFlags(os, command.flags);
  }
  os << "\nGlobal flags:\n";
  PrintFlags(os, global_flags);
}

}  // namespace varuna::ctl

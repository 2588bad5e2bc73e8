#pragma once

// The command table behind varunactl: each command owns its name, group, synopsis, help,
// arguments, flags and run function (kubectl's one NewCmdX per command). The parser and the
// help text are generated from the table here, so a flag cannot be accepted without being
// documented, nor documented without being accepted.

#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace varuna::ctl {

class Session;
struct Command;

// One flag. A flag with a `value_name` takes a value ("--rank 3" or "--rank=3"); one
// without is a switch ("--follow"). Made with Switch(), Option() or Repeated() below.
struct Flag {
  std::string name;           // "--rank"
  std::string short_name;     // "-f"; empty = none
  std::string value_name;     // "R"; empty = a switch
  std::string help;           // one line, lower case, no full stop
  std::string default_value;  // what Value() returns when the flag is absent; shown in help
  bool repeated = false;      // may be given several times (--set); values kept in order
};

Flag Switch(std::string name, std::string help, std::string short_name = "");
Flag Option(std::string name, std::string value_name, std::string help,
            std::string default_value = "", std::string short_name = "");
Flag Repeated(std::string name, std::string value_name, std::string help);

// One positional argument, in order.
struct Arg {
  Arg(std::string name, std::string what, bool optional = false)
      : name(std::move(name)), what(std::move(what)), optional(optional) {}
  std::string name;  // "ID", as the usage line shows it
  std::string what;  // the missing-argument error says "missing <what>", e.g. "job ID"
  bool optional;
};

// Whether a command talks to the manager (Note [Manager use] in varunactl.cc).
enum class ManagerUse { kRequired, kOptional, kNone };

// What the parser made of one command line: every flag by its `name` (also when given by its
// short name), the positional arguments by their `name`, and what follows "--".
class ParsedArgs {
 public:
  // True if the flag was given.
  bool Has(const std::string& flag) const { return flags_.count(flag) > 0; }
  // The flag's (last) value, or its default_value if absent.
  std::string Value(const std::string& flag) const;
  // Every value of a repeated flag, in order; empty if absent.
  std::vector<std::string> Values(const std::string& flag) const;
  // The positional argument; empty if it is optional and absent.
  std::string Get(const std::string& arg) const;
  const std::vector<std::string>& passthrough() const { return passthrough_; }

 private:
  friend absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                              const std::vector<Flag>& global_flags,
                                              const Command& command);
  std::map<std::string, std::vector<std::string>> flags_;
  std::map<std::string, std::string> defaults_;
  std::map<std::string, std::string> args_;
  std::vector<std::string> passthrough_;
};

// One command. `run` returns the exit code on success (0, or 1 when a followed job did not
// succeed); a failed status is printed and mapped to an exit code by RunVarunactl.
struct Command {
  std::string name;
  std::vector<std::string> aliases;
  std::string group;     // the heading it is listed under: "Jobs", "Cluster", ...
  std::string synopsis;  // one line for the command list
  std::string help;      // the description `varunactl help NAME` prints; lines end in '\n'
  std::vector<Arg> args;
  std::vector<Flag> flags;
  // Accepts "-- WORDS..." at the end (ParsedArgs::passthrough), shown as `passthrough_name`.
  std::string passthrough_name;
  ManagerUse manager = ManagerUse::kRequired;
  std::function<absl::StatusOr<int>(Session&, const ParsedArgs&)> run;
};

// A usage error: InvalidArgument marked so that RunVarunactl adds the pointer to the help.
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

// True if "-h" or "--help" comes before any "--".
bool WantsHelp(const std::vector<std::string>& args);

// Parses `args` (the command line without the command's name) against the command's flags
// and `global_flags`; flags and positional arguments may be mixed in any order before "--".
// Errors are usage errors naming the problem: an unknown flag, a missing value, a switch
// given a value, a flag given twice, a missing or extra argument.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<Flag>& global_flags, const Command& command);

// The command list, grouped in the order of `groups` (then any other group, in table order),
// followed by `global_flags` and `epilogue`.
void PrintCommandList(std::ostream& os, const std::vector<Command>& commands,
                      const std::vector<std::string>& groups, const std::vector<Flag>& global_flags,
                      absl::string_view epilogue);

// One command's help: usage line, description, its flags with defaults, then the global flags.
void PrintCommandHelp(std::ostream& os, const Command& command,
                      const std::vector<Flag>& global_flags);

}  // namespace varuna::ctl

#include "ctl/varunactl.h"

#include <optional>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "ctl/command_table.h"
#include "ctl/commands.h"
#include "ctl/session.h"

namespace varuna {
namespace ctl {
namespace {

constexpr char kEpilogue[] =
    "Exit codes: 0 ok, 1 job failed/cancelled or request refused, 2 bad usage or job spec,\n"
    "3 manager unreachable.\n"
    "\n"
    "`varunactl help COMMAND` (or `varunactl COMMAND --help`) shows a command's arguments and\n"
    "flags.\n";

// The groups in the order `varunactl help` lists them.
const std::vector<std::string>& Groups() {
  static const auto* groups = new std::vector<std::string>{
      kGroupJobs, kGroupMonitoring, kGroupCluster, kGroupPlanning, kGroupOther};
  return *groups;
}

// Flags every command takes, before or after its name.
std::vector<Flag> GlobalFlags() {
  return {
      Option("--manager", "HOST:PORT[,...]",
             "the manager's address, or several managers' (the leader is found; default: "
             "$VARUNA_MANAGER)"),
      Option("--tls_ca", "FILE",
             "the cluster CA, to talk TLS to the manager (default: $VARUNA_TLS_CA)"),
      Option("--token", "T", "the bearer token the manager knows you by (default: $VARUNA_TOKEN)"),
      Option("--output", "FORMAT", "table or json", "table", "-o"),
  };
}

std::vector<Command> CommandTable();

const Command* FindCommand(const std::vector<Command>& table, const std::string& name) {
  for (const Command& c : table) {
    if (c.name == name) return &c;
    for (const std::string& alias : c.aliases) {
      if (alias == name) return &c;
    }
  }
  return nullptr;
}

absl::Status UnknownCommand(const std::string& name) {
  return UsageError(absl::StrCat("unknown command '", name, "'"));
}

absl::StatusOr<int> RunHelp(Session& s, const ParsedArgs& a) {
  const std::vector<Command> table = CommandTable();
  const std::string name = a.Get("COMMAND");
  if (name.empty()) {
    PrintCommandList(s.out(), table, Groups(), GlobalFlags(), kEpilogue);
    return kExitOk;
  }
  const Command* c = FindCommand(table, name);
  if (c == nullptr) return UnknownCommand(name);
  PrintCommandHelp(s.out(), *c, GlobalFlags());
  return kExitOk;
}

Command NewCmdHelp() {
  Command c;
  c.name = "help";
  c.group = kGroupOther;
  c.synopsis = "the command list, or one command's arguments and flags";
  c.help =
      "Without COMMAND, lists the commands by group. With it, shows that command's usage,\n"
      "description and flags (as `varunactl COMMAND --help` does). Never contacts the\n"
      "manager.\n";
  c.args = {Arg("COMMAND", "COMMAND", /*optional=*/true)};
  c.manager = ManagerUse::kNone;
  c.run = RunHelp;
  return c;
}

std::vector<Command> CommandTable() {
  return {NewCmdSubmit(), NewCmdList(),    NewCmdQueue(),   NewCmdStatus(),
          NewCmdCancel(), NewCmdLogs(),    NewCmdEvents(),  NewCmdMetrics(),
          NewCmdNodes(),  NewCmdDrain(),   NewCmdPreempt(), NewCmdManagers(),
          NewCmdPlan(),   NewCmdProfile(), NewCmdData(),    NewCmdHelp()};
}

// The position of the command's name in `args`: the first word before "--" that is neither
// a flag nor a global flag's value.
std::optional<size_t> CommandIndex(const std::vector<std::string>& args,
                                   const std::vector<Flag>& global_flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.empty() || a[0] != '-') return i;
    if (a.find('=') != std::string::npos) continue;
    for (const Flag& f : global_flags) {
      if ((a == f.name || a == f.short_name) && !f.value_name.empty()) {
        ++i;
        break;
      }
    }
  }
  return std::nullopt;
}

// Note [Manager use]: help, and every usage error, come before anything touches the
// manager: the command line is parsed against the table first, and `help`, `-h` and
// `--help` (anywhere before "--") print from the table alone, so they work with no manager
// or a dead one. Then the command's ManagerUse decides: kRequired needs an address (the
// flag or $VARUNA_MANAGER; a usage error otherwise), kOptional (plan with --slots/--nodes)
// uses one if given, kNone never connects. The address and CA are checked before the
// command runs (a usage error, exit 2); gRPC connects on the first call, whose failure is
// exit 3 (Session::CallError).
absl::StatusOr<int> Dispatch(const std::vector<std::string>& args, const CtlEnvironment& env,
                             std::ostream& out, std::ostream& err, std::string* command_name) {
  const std::vector<Command> table = CommandTable();
  const std::vector<Flag> global_flags = GlobalFlags();
  const std::optional<size_t> index = CommandIndex(args, global_flags);
  if (!index.has_value()) {
    if (WantsHelp(args)) {
      PrintCommandList(out, table, Groups(), global_flags, kEpilogue);
      return kExitOk;
    }
    return UsageError("missing COMMAND");
  }
  const Command* command = FindCommand(table, args[*index]);
  if (command == nullptr) return UnknownCommand(args[*index]);
  *command_name = command->name;
  if (WantsHelp(args)) {
    PrintCommandHelp(out, *command, global_flags);
    return kExitOk;
  }
  std::vector<std::string> rest = args;
  rest.erase(rest.begin() + *index);
  ASSIGN_OR_RETURN(ParsedArgs parsed, ParseArgs(rest, global_flags, *command));
  const std::string output = parsed.Value("--output");
  if (output != "table" && output != "json") {
    return UsageError(absl::StrCat("-o must be table or json, not '", output, "'"));
  }
  Session session(out, err, output == "json");
  ManagerOptions manager;
  manager.address = parsed.Has("--manager") ? parsed.Value("--manager") : env.manager;
  manager.tls_ca = parsed.Has("--tls_ca") ? parsed.Value("--tls_ca") : env.tls_ca;
  manager.token = parsed.Has("--token") ? parsed.Value("--token") : env.token;
  if (command->manager != ManagerUse::kNone) {
    if (!manager.address.empty()) {
      if (absl::Status s = session.Connect(manager); !s.ok()) return UsageError(s.message());
    } else if (command->manager == ManagerUse::kRequired) {
      return UsageError("no manager: pass --manager HOST:PORT or set VARUNA_MANAGER");
    }
  }
  return command->run(session, parsed);
}

// Prints a failed command's status and returns its exit code (varunactl.h).
int ReportError(const absl::Status& s, const std::string& command_name, std::ostream& err) {
  err << "varunactl: " << s.message() << "\n";
  if (IsUsageError(s)) {
    err << "(" << (command_name.empty() ? "varunactl help" : "varunactl help " + command_name)
        << " for usage)\n";
    return kExitUsage;
  }
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

}  // namespace
}  // namespace ctl

int RunVarunactl(const std::vector<std::string>& args, const CtlEnvironment& env, std::ostream& out,
                 std::ostream& err) {
  if (args.empty()) {
    ctl::PrintCommandList(err, ctl::CommandTable(), ctl::Groups(), ctl::GlobalFlags(),
                          ctl::kEpilogue);
    return kExitUsage;
  }
  std::string command_name;
  absl::StatusOr<int> result = ctl::Dispatch(args, env, out, err, &command_name);
  if (result.ok()) return *result;
  return ctl::ReportError(result.status(), command_name, err);
}

}  // namespace varuna

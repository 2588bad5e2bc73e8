// The generic command-line parser and help rendering behind varunactl.

#include "ctl/command_table.h"

#include <sstream>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace varuna::ctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::varuna::testing::StatusIs;

std::vector<Flag> Globals() { return {{"--output", "-o", "FORMAT", "table or json", "table"}}; }

Command Example() {
  Command c;
  c.name = "run";
  c.group = "Things";
  c.synopsis = "run a thing";
  c.help = "Runs a thing.\n";
  c.args = {{"FILE", "job FILE"}, {"ID", "job ID", /*optional=*/true}};
  c.flags = {
      {"--follow", "-f", "", "keep going"},
      {"--rank", "", "R", "which rank", "0"},
      {"--set", "", "KEY=VALUE", "a field", "", /*repeated=*/true},
  };
  c.passthrough_name = "PROGRAM ARGS...";
  return c;
}

TEST(ParseArgsTest, FlagsAndArgumentsInAnyOrder) {
  const Command c = Example();
  ASSERT_OK_AND_ASSIGN(ParsedArgs a, ParseArgs({"--set", "a=1", "job.yaml", "-f", "--rank=3", "7",
                                                "-o", "json", "--set=b=2"},
                                               Globals(), c));
  EXPECT_EQ(a.Get("FILE"), "job.yaml");
  EXPECT_EQ(a.Get("ID"), "7");
  EXPECT_TRUE(a.Has("--follow"));  // by its short name
  EXPECT_EQ(a.Value("--rank"), "3");
  EXPECT_THAT(a.Values("--set"), ElementsAre("a=1", "b=2"));
  EXPECT_EQ(a.Value("--output"), "json");
  EXPECT_THAT(a.passthrough(), IsEmpty());
}

TEST(ParseArgsTest, DefaultsAndOptionalArguments) {
  ASSERT_OK_AND_ASSIGN(ParsedArgs a, ParseArgs({"job.yaml"}, Globals(), Example()));
  EXPECT_FALSE(a.Has("--rank"));
  EXPECT_EQ(a.Value("--rank"), "0");
  EXPECT_EQ(a.Value("--output"), "table");
  EXPECT_EQ(a.Get("ID"), "");
  EXPECT_FALSE(a.Has("--follow"));
}

TEST(ParseArgsTest, EverythingAfterDoubleDashIsPassedThrough) {
  ASSERT_OK_AND_ASSIGN(
      ParsedArgs a, ParseArgs({"job.yaml", "--", "python3", "-f", "--help"}, Globals(), Example()));
  EXPECT_THAT(a.passthrough(), ElementsAre("python3", "-f", "--help"));
  EXPECT_FALSE(a.Has("--follow"));
  Command no_passthrough = Example();
  no_passthrough.passthrough_name.clear();
  EXPECT_THAT(ParseArgs({"job.yaml", "--", "x"}, Globals(), no_passthrough),
              StatusIs(absl::StatusCode::kInvalidArgument, "unexpected argument '--'"));
}

TEST(ParseArgsTest, ErrorsNameTheProblemAndAreUsageErrors) {
  const Command c = Example();
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"job.yaml", "--bogus"}, "unknown flag '--bogus' for 'run'"},
      {{"job.yaml", "--bogus=1"}, "unknown flag '--bogus' for 'run'"},
      {{"job.yaml", "--rank"}, "--rank needs a value"},
      {{"job.yaml", "-f=yes"}, "-f takes no value"},
      {{"job.yaml", "--rank", "1", "--rank", "2"}, "--rank given more than once"},
      {{"job.yaml", "-f", "--follow"}, "--follow given more than once"},
      {{}, "missing job FILE"},
      {{"--rank", "2"}, "missing job FILE"},
      {{"job.yaml", "7", "8"}, "unexpected argument '8'"},
  };
  for (const Case& k : cases) {
    auto a = ParseArgs(k.args, Globals(), c);
    EXPECT_THAT(a, StatusIs(absl::StatusCode::kInvalidArgument, k.message)) << k.message;
    EXPECT_TRUE(IsUsageError(a.status())) << k.message;
  }
  EXPECT_FALSE(IsUsageError(absl::InvalidArgumentError("bad spec")));
}

TEST(WantsHelpTest, OnlyBeforeDoubleDash) {
  EXPECT_TRUE(WantsHelp({"submit", "-h"}));
  EXPECT_TRUE(WantsHelp({"--help", "submit"}));
  EXPECT_FALSE(WantsHelp({"submit", "job.yaml", "--", "prog", "--help"}));
  EXPECT_FALSE(WantsHelp({"submit", "job.yaml"}));
}

TEST(HelpTest, CommandHelpShowsUsageFlagsAndDefaults) {
  std::ostringstream os;
  PrintCommandHelp(os, Example(), Globals());
  const std::string help = os.str();
  EXPECT_THAT(help, HasSubstr("varunactl run: run a thing\n"));
  EXPECT_THAT(help, HasSubstr("usage: varunactl run FILE [ID] [flags] [-- PROGRAM ARGS...]\n"));
  EXPECT_THAT(help, HasSubstr("Runs a thing.\n"));
  EXPECT_THAT(help, HasSubstr("  -f, --follow"));
  EXPECT_THAT(help, HasSubstr("which rank (default: 0)"));
  EXPECT_THAT(help, HasSubstr("a field; repeatable"));
  EXPECT_THAT(help,
              HasSubstr("Global flags:\n  -o, --output FORMAT  table or json (default: table)"));
}

TEST(HelpTest, CommandListIsGroupedInTheGivenOrder) {
  Command a = Example();
  Command b = Example();
  b.name = "stop";
  b.group = "Early";
  b.synopsis = "stop a thing";
  b.aliases = {"halt"};
  std::ostringstream os;
  PrintCommandList(os, {a, b}, {"Early"}, Globals(), "THE END\n");
  const std::string list = os.str();
  const size_t early = list.find("\nEarly:\n  stop  stop a thing (alias: halt)\n");
  const size_t things = list.find("\nThings:\n  run   run a thing\n");
  ASSERT_NE(early, std::string::npos) << list;
  ASSERT_NE(things, std::string::npos) << list;
  EXPECT_LT(early, things);
  EXPECT_THAT(list, HasSubstr("Global flags (every command):\n"));
  EXPECT_THAT(list, HasSubstr("THE END\n"));
  EXPECT_THAT(list, Not(HasSubstr("which rank")));  // flags are in the command's help only
}

}  // namespace
}  // namespace varuna::ctl

#include "common/launch/worker_protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/launch/worker_channel.h"
#include "tests/testing/eventually.h"
#include "tests/testing/status_matchers.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;
using ::varuna::testing::Eventually;
using ::varuna::testing::IsOk;
using ::varuna::testing::StatusIs;

v1::WorkerEvent RoundTrip(const v1::WorkerEvent& e) {
  absl::StatusOr<std::string> line = SerializeWorkerEvent(e);
  EXPECT_THAT(line, IsOk());
  if (!line.ok()) return {};
  EXPECT_EQ(line->find('\n'), std::string::npos) << *line;
  absl::StatusOr<v1::WorkerEvent> back = ParseWorkerEvent(*line);
  EXPECT_THAT(back, IsOk()) << *line;
  return back.ok() ? *back : v1::WorkerEvent();
}

TEST(WorkerProtocolTest, EveryEventKindRoundTrips) {
  v1::WorkerEvent ready;
  ready.set_t(1700000000.25);
  ready.mutable_ready()->set_resumed_from(17);
  v1::WorkerEvent r = RoundTrip(ready);
  EXPECT_EQ(r.ready().resumed_from(), 17);
  EXPECT_DOUBLE_EQ(r.t(), 1700000000.25);

  v1::WorkerEvent step;
  step.set_t(5);
  v1::StepMetrics* m = step.mutable_step();
  m->set_step(3);
  m->set_loss(2.5);
  m->set_grad_norm(0.125);
  m->set_samples_per_s(80);
  m->set_at(4.5);
  m->add_stage_busy_s(0.1);
  m->add_stage_busy_s(0.2);
  r = RoundTrip(step);
  ASSERT_TRUE(r.has_step());
  EXPECT_EQ(r.step().step(), 3);
  EXPECT_DOUBLE_EQ(r.step().loss(), 2.5);
  EXPECT_DOUBLE_EQ(r.step().at(), 4.5);
  EXPECT_EQ(r.step().stage_busy_s_size(), 2);

  v1::WorkerEvent stopped;
  stopped.mutable_stopped()->set_saved_step(9);
  EXPECT_EQ(RoundTrip(stopped).stopped().saved_step(), 9);
  v1::WorkerEvent rescued;
  rescued.mutable_rescued()->set_saved_step(0);
  EXPECT_TRUE(RoundTrip(rescued).has_rescued());
  v1::WorkerEvent profile;
  profile.mutable_profile()->set_path("/w/gen1/profile.json");
  EXPECT_EQ(RoundTrip(profile).profile().path(), "/w/gen1/profile.json");
  v1::WorkerEvent error;
  error.mutable_error()->set_message("data.path \"x\" is\nnot a file");
  error.mutable_error()->set_bad_input(true);
  r = RoundTrip(error);
  EXPECT_EQ(r.error().message(), "data.path \"x\" is\nnot a file");
  EXPECT_TRUE(r.error().bad_input());
}

TEST(WorkerProtocolTest, TheTypedFormIsOneJsonObjectKeyedByKind) {
  v1::WorkerEvent e;
  e.set_t(2);
  e.mutable_ready()->set_resumed_from(0);
  ASSERT_OK_AND_ASSIGN(std::string line, SerializeWorkerEvent(e));
  EXPECT_EQ(line, R"({"t":2,"ready":{"resumed_from":0}})");
}

TEST(WorkerProtocolTest, NonFiniteNumbersSurvive) {
  v1::WorkerEvent e;
  e.mutable_step()->set_step(1);
  e.mutable_step()->set_loss(std::nan(""));
  e.mutable_step()->set_grad_norm(INFINITY);
  const v1::WorkerEvent r = RoundTrip(e);
  EXPECT_TRUE(std::isnan(r.step().loss()));
  EXPECT_TRUE(std::isinf(r.step().grad_norm()));
  // printf's spellings in a user's flat line, bare or quoted; a string that only contains
  // "nan" is left alone.
  ASSERT_OK_AND_ASSIGN(v1::WorkerEvent flat,
                       ParseWorkerEvent(R"({"step": 2, "loss": nan, "grad_norm": -inf,)"
                                        R"( "lr": "inf", "name": "banana"})"));
  EXPECT_TRUE(std::isnan(flat.step().loss()));
  EXPECT_EQ(flat.step().grad_norm(), -INFINITY);
  EXPECT_EQ(flat.step().lr(), INFINITY);
  ASSERT_OK_AND_ASSIGN(flat, ParseWorkerEvent(R"({"error": "loss is nan"})"));
  EXPECT_EQ(flat.error().message(), "loss is nan");
}

// The lines user programs (and older workers) write keep working.
TEST(WorkerProtocolTest, FlatLinesParseIntoTheSameEvents) {
  ASSERT_OK_AND_ASSIGN(
      v1::WorkerEvent e,
      ParseWorkerEvent(R"({"step": 7, "loss": 2.5, "step_time_s": 0.1, "samples_per_s": 80})"));
  ASSERT_TRUE(e.has_step());
  EXPECT_EQ(e.step().step(), 7);
  EXPECT_DOUBLE_EQ(e.step().loss(), 2.5);
  EXPECT_DOUBLE_EQ(e.step().samples_per_s(), 80);
  EXPECT_FALSE(e.step().stopped());

  // An older worker's step line: the whole StepMetrics JSON, "t" for the time.
  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"step": 4, "loss": 1, "overflow": true, )"
                                           R"("stage_busy_s": [0.5, 0.25], "t": 12.5})"));
  EXPECT_TRUE(e.step().overflow());
  EXPECT_EQ(e.step().stage_busy_s_size(), 2);
  EXPECT_DOUBLE_EQ(e.step().at(), 12.5);
  EXPECT_DOUBLE_EQ(e.t(), 12.5);

  // Fields of a wrong type are ignored, as they always were.
  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"step": 5, "loss": "low", "overflow": 1})"));
  EXPECT_EQ(e.step().step(), 5);
  EXPECT_EQ(e.step().loss(), 0);

  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"step": 7, "loss": 2.5, "stopped": true})"));
  EXPECT_TRUE(e.step().stopped());

  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"ready": true, "resumed_from": 3, "t": 1.5})"));
  EXPECT_EQ(e.ready().resumed_from(), 3);
  EXPECT_DOUBLE_EQ(e.t(), 1.5);
  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"ready": true})"));
  EXPECT_TRUE(e.has_ready());

  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"stopped": true, "saved_step": 20, "t": 2})"));
  EXPECT_EQ(e.stopped().saved_step(), 20);
  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"stopped": true})"));
  EXPECT_EQ(e.stopped().saved_step(), 0);
  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"rescued": true, "saved_step": 6})"));
  EXPECT_EQ(e.rescued().saved_step(), 6);

  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"profile": "/w/profile.json"})"));
  EXPECT_EQ(e.profile().path(), "/w/profile.json");
  ASSERT_OK_AND_ASSIGN(e, ParseWorkerEvent(R"({"error": "bad data", "bad_input": true})"));
  EXPECT_EQ(e.error().message(), "bad data");
  EXPECT_TRUE(e.error().bad_input());
  EXPECT_TRUE(e.error().command().empty());

  // Trailing "\r" or spaces (a line written on another system).
  EXPECT_THAT(ParseWorkerEvent("{\"step\": 1}\r"), IsOk());
}

TEST(WorkerProtocolTest, BadLinesAreRefusedSayingWhy) {
  EXPECT_THAT(ParseWorkerEvent(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ParseWorkerEvent("   "), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(ParseWorkerEvent("step 3 loss 2"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a JSON object"));
  EXPECT_THAT(ParseWorkerEvent("[1, 2]"), StatusIs(absl::StatusCode::kInvalidArgument, "JSON"));
  EXPECT_THAT(ParseWorkerEvent(R"({"step": 1} trailing)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "JSON"));
  EXPECT_THAT(ParseWorkerEvent(R"({"loss": 2.5})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected one of ready, step"));
  EXPECT_THAT(ParseWorkerEvent(R"({"step": 0, "loss": 1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'step' must be an integer"));
  EXPECT_THAT(ParseWorkerEvent(R"({"step": 2.5})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'step' must be an integer"));
  EXPECT_THAT(ParseWorkerEvent(R"({"step": 1e12})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'step' must be an integer"));
  EXPECT_THAT(ParseWorkerEvent(R"({"step": "7"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'step' must be an integer"));
  EXPECT_THAT(ParseWorkerEvent(R"({"stopped": true, "saved_step": -1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "saved_step"));
  EXPECT_THAT(ParseWorkerEvent(R"({"ready": true, "resumed_from": "x"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "resumed_from"));
  // The typed form: its own rules.
  EXPECT_THAT(ParseWorkerEvent(R"({"step": {"step": 0}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a step number"));
  EXPECT_THAT(ParseWorkerEvent(R"({"ready": {}, "step": {"step": 1}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad event"));
  EXPECT_THAT(ParseWorkerEvent(R"({"step": {"step": "many"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad event"));
  EXPECT_THAT(ParseWorkerEvent(R"({"stopped": {"saved_step": -3}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "saved_step must be >= 0"));
  EXPECT_THAT(ParseWorkerEvent(R"({"profile": {"path": ""}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "profile"));
  EXPECT_THAT(ParseWorkerEvent(R"({"t": 1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected one of"));
  // Deep nesting is refused, not recursed into without bound.
  EXPECT_FALSE(ParseWorkerEvent(
                   absl::StrCat("{\"a\": ", std::string(5000, '['), std::string(5000, ']'), "}"))
                   .ok());
  // Unknown keys (a newer worker's) are ignored in both forms.
  EXPECT_THAT(ParseWorkerEvent(R"({"t": 1, "mood": "good", "ready": {"new_field": 1}})"), IsOk());
}

TEST(WorkerProtocolTest, LinesAreBounded) {
  const std::string pad(kMaxEventLineBytes, ' ');
  EXPECT_THAT(
      ParseWorkerEvent(absl::StrCat(R"({"error": ")", std::string(kMaxEventLineBytes, 'x'), "\"}")),
      StatusIs(absl::StatusCode::kInvalidArgument, "over the limit"));
  // Surrounding whitespace does not count.
  EXPECT_THAT(ParseWorkerEvent(absl::StrCat(pad, R"({"step": 1})", pad)), IsOk());

  // An error message is cut, at a character boundary, in both directions.
  v1::WorkerEvent e;
  e.mutable_error()->set_message(std::string(kMaxErrorBytes - 1, 'a') + "\xc3\xa9tc");
  ASSERT_OK_AND_ASSIGN(std::string line, SerializeWorkerEvent(e));
  ASSERT_OK_AND_ASSIGN(v1::WorkerEvent back, ParseWorkerEvent(line));
  EXPECT_EQ(back.error().message(), std::string(kMaxErrorBytes - 1, 'a'));
  ASSERT_OK_AND_ASSIGN(
      back, ParseWorkerEvent(absl::StrCat(R"({"error": ")", std::string(5000, 'b'), "\"}")));
  EXPECT_EQ(back.error().message().size(), kMaxErrorBytes);

  // Too many stage values are dropped, not the step.
  v1::WorkerEvent step;
  step.mutable_step()->set_step(1);
  for (int i = 0; i <= kMaxStageValues; ++i) step.mutable_step()->add_stage_wait_s(i);
  EXPECT_EQ(RoundTrip(step).step().stage_wait_s_size(), 0);

  // An event that cannot be a line is refused at the writer.
  v1::WorkerEvent none;
  EXPECT_THAT(SerializeWorkerEvent(none), StatusIs(absl::StatusCode::kInvalidArgument, "no event"));
  v1::WorkerEvent long_path;
  long_path.mutable_profile()->set_path(std::string(kMaxPathBytes + 1, 'p'));
  EXPECT_THAT(SerializeWorkerEvent(long_path),
              StatusIs(absl::StatusCode::kInvalidArgument, "profile"));
}

TEST(WorkerProtocolTest, InvalidUtf8IsReplacedNotFatal) {
  ASSERT_OK_AND_ASSIGN(v1::WorkerEvent e, ParseWorkerEvent("{\"error\": \"bad \xff\xfe byte\"}"));
  EXPECT_EQ(e.error().message(), "bad ?? byte");
  v1::WorkerEvent w;
  w.mutable_error()->set_message("caf\xc3\xa9 \xc3");
  EXPECT_EQ(RoundTrip(w).error().message(), "caf\xc3\xa9 ?");
}

TEST(WorkerProtocolTest, CommandsRoundTripAndAreChecked) {
  v1::AgentCommand stop;
  stop.set_generation(3);
  stop.mutable_stop();
  ASSERT_OK_AND_ASSIGN(std::string line, SerializeAgentCommand(stop));
  EXPECT_EQ(line, R"({"generation":3,"stop":{"park":false}})");
  ASSERT_OK_AND_ASSIGN(v1::AgentCommand back, ParseAgentCommand(line));
  EXPECT_TRUE(back.has_stop());
  // A graceful morph in place: the worker checkpoints, then waits to regroup.
  stop.mutable_stop()->set_park(true);
  ASSERT_OK_AND_ASSIGN(line, SerializeAgentCommand(stop));
  ASSERT_OK_AND_ASSIGN(back, ParseAgentCommand(line));
  EXPECT_TRUE(back.stop().park());
  EXPECT_EQ(back.generation(), 3);
  EXPECT_STREQ(CommandKindName(back), "stop");

  ASSERT_OK_AND_ASSIGN(back, ParseAgentCommand(R"({"checkpoint_now": {}})"));
  EXPECT_TRUE(back.has_checkpoint_now());
  EXPECT_EQ(back.generation(), 0);

  v1::AgentCommand re;
  re.set_generation(1);
  re.mutable_reconfigure()->set_generation(2);
  re.mutable_reconfigure()->set_pipelines("0,3,6:12;0,6:4");
  re.mutable_reconfigure()->set_rank(2);
  re.mutable_reconfigure()->set_master_addr("10.0.0.1");
  re.mutable_reconfigure()->set_master_port(29500);
  ASSERT_OK_AND_ASSIGN(line, SerializeAgentCommand(re));
  ASSERT_OK_AND_ASSIGN(back, ParseAgentCommand(line));
  EXPECT_EQ(back.reconfigure().pipelines(), "0,3,6:12;0,6:4");
  EXPECT_EQ(back.reconfigure().rank(), 2);

  re.mutable_reconfigure()->set_rank(3);  // the world has 3 ranks
  EXPECT_THAT(SerializeAgentCommand(re),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the world of 3"));
  re.mutable_reconfigure()->set_rank(0);
  re.mutable_reconfigure()->set_pipelines("nonsense");
  EXPECT_THAT(SerializeAgentCommand(re),
              StatusIs(absl::StatusCode::kInvalidArgument, "reconfigure"));
  // The uniform form: a stage map with each pipeline's batch instead of pipelines.
  re.mutable_reconfigure()->clear_pipelines();
  re.mutable_reconfigure()->set_stage_to_rank_map("0,2;1,3;");
  EXPECT_THAT(SerializeAgentCommand(re),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs per_replica_batch"));
  re.mutable_reconfigure()->set_per_replica_batch(12);
  EXPECT_OK(SerializeAgentCommand(re).status());
  re.mutable_reconfigure()->set_rank(4);
  EXPECT_THAT(SerializeAgentCommand(re),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the world of 4"));
  re.mutable_reconfigure()->set_rank(0);
  re.mutable_reconfigure()->set_stage_to_rank_map("");
  EXPECT_THAT(SerializeAgentCommand(re), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  "needs pipelines or a stage_to_rank_map"));
  re.mutable_reconfigure()->set_pipelines("0,6:4");
  re.mutable_reconfigure()->set_generation(0);
  EXPECT_THAT(SerializeAgentCommand(re),
              StatusIs(absl::StatusCode::kInvalidArgument, "generation must be >= 1"));

  EXPECT_THAT(ParseAgentCommand(R"({"generation": 2})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no command"));
  EXPECT_THAT(ParseAgentCommand(R"({"stop": {}, "checkpoint_now": {}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad command"));
  EXPECT_THAT(ParseAgentCommand("SIGUSR1"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad command"));
  EXPECT_THAT(ParseAgentCommand(absl::StrCat(R"({"stop": {}, "x": ")",
                                             std::string(kMaxCommandLineBytes, 'x'), "\"}")),
              StatusIs(absl::StatusCode::kInvalidArgument, "over the limit"));
}

class WorkerChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/worker_channel_", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> Lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }

  std::string dir_;
};

TEST_F(WorkerChannelTest, EventsAreAppendedOneLineEach) {
  const std::string path = dir_ + "/progress.rank0";
  v1::WorkerEvent ready;
  ready.mutable_ready()->set_resumed_from(2);
  ASSERT_THAT(AppendWorkerEventTo(path, ready), IsOk());
  v1::WorkerEvent step;
  step.mutable_step()->set_step(3);
  ASSERT_THAT(AppendWorkerEventTo(path, step), IsOk());
  const std::vector<std::string> lines = Lines(path);
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_OK_AND_ASSIGN(v1::WorkerEvent first, ParseWorkerEvent(lines[0]));
  EXPECT_EQ(first.ready().resumed_from(), 2);
  EXPECT_GT(first.t(), 1.6e9) << "stamped with the time";
  ASSERT_OK_AND_ASSIGN(v1::WorkerEvent second, ParseWorkerEvent(lines[1]));
  EXPECT_EQ(second.step().step(), 3);
  EXPECT_EQ(second.step().at(), second.t());

  // Through the environment, as the worker does; without it, nothing happens.
  ASSERT_EQ(setenv(kProgressFileEnv, path.c_str(), 1), 0);
  EXPECT_THAT(AppendWorkerEvent(ready), IsOk());
  ASSERT_EQ(unsetenv(kProgressFileEnv), 0);
  EXPECT_THAT(AppendWorkerEvent(ready), IsOk());
  EXPECT_EQ(Lines(path).size(), 3u);

  // A symlink where the progress file should be is not followed.
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_FALSE(AppendWorkerEventTo(link, ready).ok());
  v1::WorkerEvent bad;
  EXPECT_FALSE(AppendWorkerEventTo(path, bad).ok());
  EXPECT_EQ(Lines(path).size(), 3u);
}

TEST_F(WorkerChannelTest, ListenerHandsOverCommandsAndSkipsBadLines) {
  const std::string fifo = dir_ + "/control.rank0";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::Mutex mu;
  std::vector<v1::AgentCommand> got;
  ASSERT_OK_AND_ASSIGN(auto listener, AgentCommandListener::Start(fifo, /*generation=*/2,
                                                                  [&](const v1::AgentCommand& c) {
                                                                    absl::MutexLock lock(&mu);
                                                                    got.push_back(c);
                                                                  }));
  // The agent's side: a non-blocking write-only open succeeds because the listener holds it.
  const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  const std::string text =
      absl::StrCat("not json\n", R"({"generation": 1, "stop": {}})", "\n",  // another generation's
                   std::string(kMaxCommandLineBytes + 10, 'z'), "\n",       // over-long
                   R"({"generation": 2, "checkpoint_now": {}})", "\n", R"({"stop": {}})", "\n",
                   R"({"stop")");  // half a line: waits for the rest
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ASSERT_TRUE(Eventually([&] { return listener->handled() == 2; }));
  ASSERT_EQ(write(fd, ": {}}\n", 6), 6);
  ASSERT_TRUE(Eventually([&] { return listener->handled() == 3; }));
  close(fd);
  listener.reset();  // stops and joins at once
  absl::MutexLock lock(&mu);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].has_checkpoint_now());
  EXPECT_TRUE(got[1].has_stop());
  EXPECT_TRUE(got[2].has_stop());
}

TEST_F(WorkerChannelTest, AProgressFileIsARegularFile) {
  v1::WorkerEvent e;
  e.mutable_step()->set_step(1);
  EXPECT_THAT(AppendWorkerEventTo("/dev/null", e),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not a regular file"));
  EXPECT_THAT(AppendWorkerEventTo(dir_ + "/progress", e), IsOk());
}

TEST_F(WorkerChannelTest, ListenerRefusesWhatIsNotAFifo) {
  EXPECT_THAT(AgentCommandListener::Start(dir_ + "/missing", 0, [](const v1::AgentCommand&) {}),
              StatusIs(absl::StatusCode::kNotFound, "control FIFO"));
  const std::string file = dir_ + "/file";
  std::ofstream(file) << "x";
  EXPECT_THAT(AgentCommandListener::Start(file, 0, [](const v1::AgentCommand&) {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not a FIFO"));
  EXPECT_THAT(
      AgentCommandListener::Adopt(open(file.c_str(), O_RDONLY), 0, [](const v1::AgentCommand&) {}),
      StatusIs(absl::StatusCode::kFailedPrecondition, "not a pipe"));
  EXPECT_THAT(AgentCommandListener::Adopt(-1, 0, [](const v1::AgentCommand&) {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not a pipe"));
}

// The agent's pipe (Note [Worker protocol]): its empty first line is no command, and a pipe
// whose writer (the agent) is gone ends the thread instead of spinning on end-of-file.
TEST_F(WorkerChannelTest, APipesFirstLineIsSkippedAndItsEndStopsTheListener) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::atomic<int> stops{0};
  ASSERT_OK_AND_ASSIGN(auto listener,
                       AgentCommandListener::Adopt(p[0], 0, [&](const v1::AgentCommand& c) {
                         if (c.has_stop()) ++stops;
                       }));
  const std::string lines = "\n{\"stop\":{}}\n";
  ASSERT_EQ(write(p[1], lines.data(), lines.size()), static_cast<ssize_t>(lines.size()));
  ASSERT_TRUE(Eventually([&] { return stops.load() == 1; }));
  close(p[1]);
  struct rusage before {};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  struct rusage after {};
  getrusage(RUSAGE_SELF, &after);
  const double cpu_s = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) +
                       (after.ru_utime.tv_usec - before.ru_utime.tv_usec) / 1e6;
  EXPECT_LT(cpu_s, 0.1) << "the listener spins on a closed pipe";
  EXPECT_EQ(listener->handled(), 1);
}

}  // namespace
}  // namespace varuna

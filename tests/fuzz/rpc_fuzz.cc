// Every gRPC handler's request validation, with state: an input is a sequence of requests,
// each `selector byte, 2-byte length, serialized message`, sent to one Manager (SQLite state
// in a scratch directory, a fake clock, agents that never answer) and one Agent (a fake
// launcher). Whatever a peer sends must give a reply or an error, never a crash; a fresh
// manager and agent per input keeps every finding reproducible.

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <string>

#include "agent/agent.h"
#include "manager/api/manager_api.h"
#include "manager/manager.h"
#include "manager/state/state_store.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_launcher.h"

namespace {

using varuna::v1::CheckpointRequest;
using varuna::v1::FetchLogsRequest;
using varuna::v1::HeartbeatRequest;
using varuna::v1::LaunchRequest;
using varuna::v1::RegisterRequest;
using varuna::v1::StopRequest;
using varuna::v1::SubmitRequest;

class SilentAgent final : public varuna::AgentClient {
 public:
  void Launch(const varuna::v1::LaunchRequest&, Done<varuna::v1::LaunchResponse> d) override {
    d(absl::UnavailableError("fuzz: no agent"));
  }
  void Stop(const varuna::v1::StopRequest&, Done<varuna::v1::StopResponse> d) override {
    d(absl::UnavailableError("fuzz: no agent"));
  }
  void Checkpoint(const varuna::v1::CheckpointRequest&,
                  Done<varuna::v1::CheckpointResponse> d) override {
    d(absl::UnavailableError("fuzz: no agent"));
  }
  void FetchLogs(const varuna::v1::FetchLogsRequest&,
                 Done<varuna::v1::FetchLogsResponse> d) override {
    d(absl::UnavailableError("fuzz: no agent"));
  }
};

class SilentPool final : public varuna::AgentClientPool {
 public:
  std::shared_ptr<varuna::AgentClient> For(const std::string&, const std::string&) override {
    return std::make_shared<SilentAgent>();
  }
};

template <typename M>
bool ParseInto(const std::string& bytes, M* m) {
  return m->ParseFromString(bytes);
}

}  // namespace

// Logging off: the code under test logs every refusal, which would drown the fuzzer.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  varuna::fuzz::QuietLogging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = varuna::fuzz::ScratchDir() + "/rpc";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/state", ec);
  auto store = varuna::StateStore::Open(dir + "/state");
  if (!store.ok()) return 0;
  varuna::testing::FakeClock clock;
  SilentPool pool;
  std::deque<std::function<void()>> posted;
  varuna::ManagerConfig mc;
  mc.state_dir = dir + "/state";
  mc.check_job_files = false;
  mc.max_nodes = 8;
  varuna::Manager manager(mc, &clock, store->get(), &pool,
                          [&](std::function<void()> fn) { posted.push_back(std::move(fn)); });
  varuna::ManagerApi api(&manager, &pool);
  (void)manager.Recover();
  varuna::AgentConfig ac;
  ac.name = "fuzz";
  ac.manager = "127.0.0.1:1";
  ac.work_dir = dir + "/agent";
  ac.slots = 4;
  varuna::testing::FakeLauncher launcher;
  varuna::Agent agent(ac, &clock, &launcher);
  agent.set_address("127.0.0.1:2");

  auto drain = [&] {
    for (int i = 0; i < 1000 && !posted.empty(); ++i) {
      auto fn = std::move(posted.front());
      posted.pop_front();
      fn();
    }
  };
  size_t at = 0;
  for (int n = 0; n < 32 && at + 3 <= size; ++n) {
    const uint8_t selector = data[at];
    const size_t len = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const std::string bytes(reinterpret_cast<const char*>(data + at + 3), len);
    at += 3 + len;
    switch (selector % 12) {
      case 0: {
        RegisterRequest r;
        if (ParseInto(bytes, &r)) (void)manager.Register(r);
        break;
      }
      case 1: {
        HeartbeatRequest r;
        if (ParseInto(bytes, &r)) (void)manager.Heartbeat(r);
        break;
      }
      case 2: {
        SubmitRequest r;
        if (ParseInto(bytes, &r)) {
          auto spec = varuna::JobAdmission::Admit(r);  // what the server runs off the loop
          if (spec.ok()) (void)api.Submit(r, *std::move(spec), "fuzz");
        }
        break;
      }
      case 3:
        (void)api.Cancel(bytes, "fuzz");
        (void)api.GetJob(bytes);
        break;
      case 4:
        (void)api.Drain(bytes, len % 2 == 0);
        (void)api.ListNodes();
        (void)api.ListJobs();
        break;
      case 5: {
        varuna::v1::GetLogsRequest r;
        if (ParseInto(bytes, &r)) api.GetLogs(r, [](auto) {});
        break;
      }
      case 6: {
        LaunchRequest r;
        if (ParseInto(bytes, &r)) (void)agent.Launch(r);
        break;
      }
      case 7: {
        StopRequest r;
        if (ParseInto(bytes, &r)) (void)agent.Stop(r);
        break;
      }
      case 8: {
        CheckpointRequest r;
        if (ParseInto(bytes, &r)) (void)agent.Checkpoint(r);
        break;
      }
      case 9: {
        FetchLogsRequest r;
        if (ParseInto(bytes, &r)) (void)agent.FetchLogs(r);
        break;
      }
      case 10: {
        varuna::v1::HeartbeatResponse r;
        if (ParseInto(bytes, &r)) agent.OnHeartbeatResponse(r);
        (void)agent.BuildHeartbeat();
        break;
      }
      case 11:
        clock.Advance(absl::Seconds(len % 60));
        manager.Tick();
        agent.Tick();
        break;
    }
    drain();
  }
  return 0;
}

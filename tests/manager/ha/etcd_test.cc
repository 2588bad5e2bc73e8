// The etcd side of several managers against a real one-member etcd (Debian's etcd-server,
// started by scripts/etcd_test_cluster.sh): the client, the election (one leader, terms that
// grow, a clean stop hands over at once), and the store's guarded writes (a deposed leader
// changes nothing). Exits 77 (skipped) without etcd.

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manager/ha/etcd_client.h"
#include "manager/ha/etcd_store.h"
#include "manager/ha/leader_election.h"

namespace varuna {
namespace {

using ::testing::HasSubstr;

std::string g_endpoints;

std::string Script() { return std::string(VARUNA_SOURCE_DIR) + "/scripts/etcd_test_cluster.sh"; }
std::string Env() {
  return absl::StrCat("VARUNA_ETCD_DIR=", ::testing::TempDir(),
                      "/etcd-unit VARUNA_ETCD_PORT=", 24790 + getpid() % 100 * 4, " ");
}

std::unique_ptr<EtcdClient> Client() {
  auto c = EtcdClient::Connect(g_endpoints, TlsConfig{}, absl::Seconds(2));
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

TEST(EtcdClientTest, PutGetPrefixTxnAndLeases) {
  auto c = Client();
  const std::string p = "/t1/";
  ASSERT_TRUE(c->DeletePrefix(p).ok());
  for (int i = 0; i < 1203; ++i) ASSERT_TRUE(c->Put(absl::StrCat(p, "k", 10000 + i), "v").ok());
  auto all = c->GetPrefix(p);  // pages of 500 underneath
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 1203u);
  EXPECT_EQ((*all)[0].key, "/t1/k10000");
  auto lease = c->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(c->Put(p + "leased", "x", *lease).ok());
  auto ttl = c->KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GT(*ttl, 0);
  ASSERT_TRUE(c->LeaseRevoke(*lease).ok());
  EXPECT_TRUE(c->Get(p + "leased")->empty()) << "the key goes with its lease";
  EXPECT_LE(*c->KeepAlive(*lease), 0);
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_FALSE(EtcdClient::Connect("nonsense", TlsConfig{}, absl::Seconds(1)).ok());
}

TEST(EtcdClientTest, AnUnreachableEndpointIsSkipped) {
  auto c = EtcdClient::Connect("127.0.0.1:1," + g_endpoints, TlsConfig{}, absl::Seconds(4));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->Put("/t2/x", "1").ok());
  EXPECT_TRUE((*c)->Put("/t2/x", "2").ok());
  auto dead = EtcdClient::Connect("127.0.0.1:1", TlsConfig{}, absl::Seconds(1));
  EXPECT_EQ((*dead)->Put("/t2/x", "3").code(), absl::StatusCode::kUnavailable);
}

TEST(LeaderElectionTest, OneLeadsTermsGrowAndACleanStopHandsOver) {
  auto c = Client();
  ASSERT_TRUE(c->DeletePrefix("/t3/").ok());
  std::atomic<int64_t> term_a{0}, term_b{0};
  LeaderElection a(c.get(), "/t3/", "a:1", absl::Seconds(2),
                   {[&](int64_t t) { term_a = t; }, [](const std::string&) {}});
  LeaderElection b(c.get(), "/t3/", "b:1", absl::Seconds(2),
                   {[&](int64_t t) { term_b = t; }, [](const std::string&) {}});
  a.Start();
  for (int i = 0; i < 100 && !a.leading(); ++i) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(a.leading());
  b.Start();
  absl::SleepFor(absl::Seconds(1));
  EXPECT_FALSE(b.leading());
  EXPECT_EQ(b.leader().address, "a:1");
  EXPECT_EQ(b.leader().term, term_a.load());
  const absl::Time stopped = absl::Now();
  a.Stop();  // revokes: b takes over within a tick, not a lease
  for (int i = 0; i < 100 && !b.leading(); ++i) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(b.leading());
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(1));
  EXPECT_GT(term_b.load(), term_a.load());
  b.Stop();
}

TEST(EtcdStoreTest, WritesApplyOnlyWhileTheTermLeads) {
  auto c = Client();
  ASSERT_TRUE(c->DeletePrefix("/t4/").ok());
  const std::string dir = ::testing::TempDir() + "/etcd-store-test";
  std::filesystem::remove_all(dir);
  auto lease = c->LeaseGrant(5);
  ASSERT_TRUE(c->Put("/t4/leader", "me", *lease).ok());
  const int64_t term = (*c->Get("/t4/leader"))[0].create_revision;
  auto store = EtcdStateStore::Open(c.get(), "/t4/", dir, absl::Seconds(1));
  ASSERT_TRUE(store.ok()) << store.status();
  v1::NodeRecord n;
  n.set_name("n1");
  EXPECT_THAT(std::string((*store)->SaveNode(n).message()), HasSubstr("not the leader"));
  std::string deposed;
  ASSERT_TRUE((*store)->TakeOver(term, [&](const std::string& why) { deposed = why; }).ok());
  ASSERT_TRUE((*store)->SaveNode(n).ok());
  v1::JobRecord j;
  j.set_seq(2);
  j.mutable_info()->set_id("7");
  ASSERT_TRUE((*store)->SaveJob(j).ok());
  ASSERT_TRUE((*store)->SaveSpec("7", "name: x\n").ok());
  EXPECT_EQ(*(*store)->LoadSpec("7"), "name: x\n");
  EXPECT_EQ((*store)->LoadNodes()->size(), 1u);
  // Events and step records reach etcd on Sync, and a takeover reads them back.
  v1::Event e;
  e.set_seq(1);
  e.set_kind("k");
  ASSERT_TRUE((*store)->SaveEvent(e).ok());
  // A deep pipeline's records (128 stages: ~2.3 KB each, 9 MB in all): each transaction
  // stays under etcd's 1.5 MiB request limit, and reading them back pages under gRPC's
  // 4 MiB message limit.
  std::vector<v1::StepRecord> steps(4000);
  for (int i = 0; i < 4000; ++i) {
    steps[i].set_step(i + 1);
    for (int k = 0; k < 128; ++k) {
      steps[i].add_stage_busy_s(0.1 + k);
      steps[i].add_stage_wait_s(0.2 + k);
    }
  }
  ASSERT_TRUE((*store)->SaveSteps("7", steps).ok());
  ASSERT_TRUE((*store)->Sync().ok());
  auto chunks = c->GetPrefix("/t4/steps/7/");
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_GT(chunks->size(), 30u);
  for (const EtcdKv& kv : *chunks) EXPECT_LE(kv.value.size(), 256u << 10) << kv.key;
  auto other = EtcdStateStore::Open(c.get(), "/t4/", dir + "2", absl::Seconds(1));
  ASSERT_TRUE((*other)->TakeOver(term, nullptr).ok());
  EXPECT_EQ((*other)->LoadSteps("7", 0, 100000)->size(), 4000u);
  // Fewer records later (the older half thinned 2:1): the chunks past the new last one go.
  ASSERT_TRUE((*store)->ThinSteps("7", 100).ok());
  absl::SleepFor(absl::Seconds(1.1));  // the flush period
  ASSERT_TRUE((*store)->Sync().ok());
  EXPECT_LT(c->GetPrefix("/t4/steps/7/")->size(), chunks->size() * 4 / 5);
  auto third = EtcdStateStore::Open(c.get(), "/t4/", dir + "3", absl::Seconds(1));
  ASSERT_TRUE((*third)->TakeOver(term, nullptr).ok());
  EXPECT_EQ((*third)->LoadSteps("7", 0, 100000)->size(), 3000u);
  EXPECT_EQ((*other)->LoadEvents(10)->size(), 1u);
  // Another leader now: a write of the old term changes nothing and says so.
  ASSERT_TRUE(c->LeaseRevoke(*lease).ok());
  ASSERT_TRUE(c->Put("/t4/leader", "someone else").ok());
  n.set_name("n2");
  EXPECT_EQ((*store)->SaveNode(n).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(deposed, HasSubstr("another manager leads"));
  EXPECT_EQ((*store)->LoadNodes()->size(), 1u);
  ASSERT_TRUE((*store)->DeleteJob("7").code() == absl::StatusCode::kFailedPrecondition);
}

// Note [Records on load] (manager/jobs/job_table.cc): bytes in etcd that are no record (any
// manager of the group writes there, and so can anyone with etcd's credentials) stop no
// manager from loading: a job's come back as a stub naming its key, a node's are skipped.
TEST(EtcdStoreTest, ACorruptRecordComesBackQuarantinedNotAsAnError) {
  auto c = Client();
  ASSERT_TRUE(c->DeletePrefix("/t5/").ok());
  const std::string dir = ::testing::TempDir() + "/etcd-store-corrupt";
  std::filesystem::remove_all(dir);
  auto store = EtcdStateStore::Open(c.get(), "/t5/", dir, absl::Seconds(1));
  ASSERT_TRUE(store.ok()) << store.status();
  v1::JobRecord j;
  j.set_seq(3);
  j.mutable_info()->set_id("3");
  ASSERT_TRUE(c->Put("/t5/jobs/3", j.SerializeAsString()).ok());
  ASSERT_TRUE(c->Put("/t5/jobs/4", std::string("\xff\xff\xff\xff\x0a", 5)).ok());
  ASSERT_TRUE(c->Put("/t5/nodes/n9", std::string("\xff\xff\xff\xff\x0a", 5)).ok());
  auto jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_TRUE((*jobs)[0].quarantined().empty());
  EXPECT_EQ((*jobs)[1].info().id(), "4");
  EXPECT_EQ((*jobs)[1].seq(), 4);
  EXPECT_THAT((*jobs)[1].quarantined(), HasSubstr("etcd /t5/jobs/4 (5 bytes) does not parse"));
  auto nodes = (*store)->LoadNodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_TRUE(nodes->empty());

  // An event is in etcd once saved, with no flush: a leader killed right after loses none
  // (Note [High-rate state] in manager/ha/etcd_store.h); a corrupt one is skipped.
  auto lease = c->LeaseGrant(5);
  ASSERT_TRUE(c->Put("/t5/leader", "me", *lease).ok());
  const int64_t term = (*c->Get("/t5/leader"))[0].create_revision;
  ASSERT_TRUE((*store)->TakeOver(term, nullptr).ok());
  v1::Event e;
  e.set_seq(41);
  e.set_kind("job_state");
  ASSERT_TRUE((*store)->SaveEvent(e).ok());
  ASSERT_TRUE(c->Put("/t5/events/000000000040", std::string("\xff\xff\xff\xff\x0a", 5)).ok());
  auto next = EtcdStateStore::Open(c.get(), "/t5/", dir + "2", absl::Seconds(1));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE((*next)->TakeOver(term, nullptr).ok());
  auto events = (*next)->LoadEvents(10);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].seq(), 41);

  // Note [Durable step records] in agent/heartbeat_report.cc: what the next leader would load.
  std::vector<v1::StepRecord> steps(6);
  for (int i = 0; i < 6; ++i) steps[i].set_step(5 + i);
  ASSERT_TRUE((*next)->SaveSteps("9", steps).ok());
  EXPECT_EQ((*next)->DurableStep("9"), 0) << "stored here, not yet in etcd";
  ASSERT_TRUE((*next)->Sync().ok());
  EXPECT_EQ((*next)->DurableStep("9"), 10);
  // An older step after that flush (an agent sending again what a killed leader held):
  // durable only below it until the next flush.
  std::vector<v1::StepRecord> late(1);
  late[0].set_step(3);
  ASSERT_TRUE((*next)->SaveSteps("9", late).ok());
  EXPECT_EQ((*next)->DurableStep("9"), 2);
  ASSERT_TRUE(c->LeaseRevoke(*lease).ok());
}

}  // namespace
}  // namespace varuna

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (std::system("command -v etcd > /dev/null") != 0) {
    std::fprintf(stderr, "etcd-server is not installed: skipped\n");
    return 77;
  }
  const std::string start = varuna::Env() + varuna::Script() + " start 1 2>/dev/null";
  FILE* p = popen(start.c_str(), "r");
  char buf[512] = {};
  std::string out;
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  if (p == nullptr || pclose(p) != 0) {
    std::fprintf(stderr, "etcd did not start\n");
    return 1;
  }
  varuna::g_endpoints = out.substr(0, out.find('\n'));
  const int rc = RUN_ALL_TESTS();
  std::system((varuna::Env() + varuna::Script() + " stop 2>/dev/null").c_str());
  return rc;
}

#include "manager/api/manager_role.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"
#include "varuna/v1/control.grpc.pb.h"

namespace varuna {
namespace {

// A deposed leader's exit status: its unit restarts it, as a standby.
constexpr int kExitDeposed = 75;

// Nothing more may be done by this process (Note [Leader lease]): its unit starts it again,
// as a standby.
[[noreturn]] void Deposed(const std::string& why) {
  LOG(ERROR) << "manager deposed (" << why << "); exiting with status " << kExitDeposed;
  std::_Exit(kExitDeposed);
}

}  // namespace

ManagerRole::ManagerRole(const ManagerConfig& config) : config_(config) {}

ManagerRole::~ManagerRole() = default;

absl::Status ManagerRole::Open(const TlsConfig& tls, std::function<void(int64_t)> on_elected) {
  if (config_.etcd_endpoints.empty()) {
    ASSIGN_OR_RETURN(store_, StateStore::Open(config_.state_dir));
    return absl::OkStatus();
  }
  // Several managers (Note [Leader lease] in manager/ha/leader_election.h): etcd's ports take
  // the cluster's certificates when the manager has them.
  several_ = true;
  ASSIGN_OR_RETURN(etcd_, EtcdClient::Connect(config_.etcd_endpoints, tls,
                                              std::min(absl::Seconds(2), config_.lease_ttl / 2)));
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdStateStore> es,
                   EtcdStateStore::Open(etcd_.get(), config_.etcd_prefix, config_.state_dir,
                                        config_.etcd_flush));
  etcd_store_ = es.get();
  store_ = std::move(es);
  // Made before the services (their gate asks it who leads), started after them (Campaign).
  LeaderElection::Callbacks cb;
  cb.on_elected = std::move(on_elected);
  cb.on_deposed = [](const std::string& why) { Deposed(why); };
  election_ = std::make_unique<LeaderElection>(etcd_.get(), config_.etcd_prefix,
                                               config_.advertise_address(), config_.lease_ttl,
                                               std::move(cb));
  return absl::OkStatus();
}

void ManagerRole::Fence() const {
  if (ready_ && !election_->may_act()) {
    Deposed("it could not renew its lease before the safe time");
  }
}

absl::Status ManagerRole::Gate(grpc::CallbackServerContext* ctx) const {
  Fence();
  if (leading()) return absl::OkStatus();
  const LeaderElection::Leader l = election_->leader();
  const std::string me = election_->me();
  if (!l.address.empty() && l.address != me) {
    // Note [Leader address]: the address comes from etcd, written by whoever leads; gRPC aborts
    // the process on a metadata value that is not printable ASCII, so only a checked one is
    // passed on (a leader's own --advertise is checked at its start too).
    if (absl::Status usable = CheckPeerAddress(l.address); !usable.ok()) {
      return absl::UnavailableError(absl::StrCat("varuna-manager ", me,
                                                 " is a standby; the leader (term ", l.term,
                                                 ") advertises an unusable ", usable.message()));
    }
    if (ctx != nullptr) ctx->AddTrailingMetadata("varuna-leader", l.address);
    return absl::UnavailableError(absl::StrCat(
        "varuna-manager ", me, " is a standby; the leader is ", l.address, " (term ", l.term, ")"));
  }
  if (l.address == me) {
    return absl::UnavailableError(absl::StrCat("varuna-manager ", me, " was elected leader (term ",
                                               l.term, ") and is loading the state; try again"));
  }
  const std::string trouble = election_->trouble();
  return absl::UnavailableError(absl::StrCat("varuna-manager ", me,
                                             " is a standby and no leader is elected yet",
                                             trouble.empty() ? "" : ": ", trouble));
}

void ManagerRole::Campaign() {
  if (election_ == nullptr) return;
  election_->Start();
  LOG(INFO) << "manager " << config_.advertise_address() << " campaigning on etcd "
            << config_.etcd_endpoints << " (prefix " << config_.etcd_prefix << ", lease "
            << absl::FormatDuration(config_.lease_ttl) << ")";
}

void ManagerRole::TakeOver(int64_t term, const std::function<absl::Status()>& recover) {
  auto fail = [](const absl::Status& s) {
    Deposed(absl::StrCat("it cannot take over: ", s.ToString()));
  };
  term_ = term;
  if (absl::Status s = etcd_store_->TakeOver(term, [](const std::string& why) { Deposed(why); });
      !s.ok()) {
    fail(s);
  }
  if (absl::Status s = recover(); !s.ok()) fail(s);
  ready_ = true;
}

void ManagerRole::Describe(v1::ListManagersResponse* resp) const {
  const std::string me = config_.advertise_address();
  resp->set_answered_by(me);
  if (!several_) {
    auto* m = resp->add_managers();
    m->set_address(me);
    m->set_leader(true);
    resp->set_leader(me);
    resp->set_store("sqlite " + config_.state_dir);
    return;
  }
  const LeaderElection::Leader l = election_->leader();
  resp->set_leader(l.address);
  resp->set_term(l.term);
  resp->set_note(election_->trouble());
  resp->set_lease_ttl_s(absl::ToDoubleSeconds(config_.lease_ttl));
  resp->set_store("etcd " + etcd_->endpoints());
  std::vector<std::string> all = election_->managers();
  if (std::find(all.begin(), all.end(), me) == all.end()) all.push_back(me);
  std::sort(all.begin(), all.end());
  for (const std::string& a : all) {
    auto* m = resp->add_managers();
    m->set_address(a);
    m->set_leader(a == l.address);
    if (a == l.address) m->set_term(l.term);
  }
}

void ManagerRole::Stop() {
  if (election_ != nullptr) election_->Stop();
}

}  // namespace varuna

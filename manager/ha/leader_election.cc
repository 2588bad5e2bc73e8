#include "manager/ha/leader_election.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace varuna {
namespace {

// How long before its lease can expire a leader stops acting (Note [Leader lease]): covers
// the clock rates of two machines and the time from a check to the action it allows.
constexpr absl::Duration kSafetyMargin = absl::Milliseconds(500);

}  // namespace

LeaderElection::LeaderElection(EtcdClient* etcd, std::string prefix, std::string me,
                               absl::Duration ttl, Callbacks callbacks)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      me_(std::move(me)),
      leader_key_(prefix_ + "leader"),
      ttl_(ttl),
      callbacks_(std::move(callbacks)) {}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Start() {
  thread_ = std::thread([this] { Run(); });
}

void LeaderElection::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  if (lease_ != 0) {
    // A clean stop hands over at once: the leader key goes with the lease.
    absl::Status s = etcd_->LeaseRevoke(lease_);
    if (!s.ok()) LOG(WARNING) << "manager: cannot revoke the leader lease: " << s.message();
    lease_ = 0;
  }
  leading_ = false;
}

LeaderElection::Leader LeaderElection::leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

bool LeaderElection::may_act() const {
  return leading_.load() && absl::ToUnixNanos(absl::Now()) < safe_until_ns_.load();
}

void LeaderElection::SetSafeUntil(absl::Time renewal_sent) {
  safe_until_ns_.store(absl::ToUnixNanos(renewal_sent + ttl_ - kSafetyMargin));
}

std::string LeaderElection::trouble() const {
  absl::MutexLock lock(&mu_);
  return trouble_;
}

std::vector<std::string> LeaderElection::managers() const {
  absl::MutexLock lock(&mu_);
  return managers_;
}

void LeaderElection::SetTrouble(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (why != trouble_ && !why.empty()) LOG(WARNING) << "manager: " << why;
  trouble_ = why;
  if (!why.empty()) leader_ = {};  // etcd cannot say who leads: nobody known
}

void LeaderElection::Run() {
  const absl::Duration tick = ttl_ / 6;
  while (!stopping_) {
    if (leading_) {
      Lead();
    } else {
      Campaign();
    }
    const absl::Time until = absl::Now() + tick;
    while (!stopping_ && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  }
}

void LeaderElection::Campaign() {
  const absl::Time campaign_sent = absl::Now();
  const int64_t ttl_s =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(ttl_))));
  if (lease_ == 0) {
    auto l = etcd_->LeaseGrant(ttl_s);
    if (!l.ok()) {
      SetTrouble(absl::StrCat("no leader can be elected: ", l.status().message()));
      return;
    }
    lease_ = *l;
  } else {
    auto t = etcd_->KeepAlive(lease_);
    if (!t.ok()) {
      SetTrouble(absl::StrCat("no leader can be elected: ", t.status().message()));
      return;
    }
    if (*t <= 0) {  // expired while etcd was away: a new one next time
      lease_ = 0;
      return;
    }
  }
  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_key(leader_key_);
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_create_revision(0);  // the key does not exist
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(leader_key_);
  put->set_value(me_);
  put->set_lease(lease_);
  if (registered_lease_ != lease_) {  // once per lease: this manager is up (varunactl managers)
    for (auto* ops : {txn.add_success(), txn.add_failure()}) {
      auto* self = ops->mutable_request_put();
      self->set_key(prefix_ + "managers/" + me_);
      self->set_value(me_);
      self->set_lease(lease_);
    }
  }
  txn.add_failure()->mutable_request_range()->set_key(leader_key_);
  auto r = etcd_->Txn(txn);
  if (!r.ok()) {
    SetTrouble(absl::StrCat("no leader can be elected: ", r.status().message()));
    return;
  }
  registered_lease_ = lease_;
  auto others = etcd_->GetPrefix(prefix_ + "managers/");
  {
    absl::MutexLock lock(&mu_);
    if (others.ok()) {
      managers_.clear();
      for (const EtcdKv& kv : *others) managers_.push_back(kv.value);
    }
  }
  // The lease was renewed (or granted) after campaign_sent.
  if (r->succeeded()) return Elected(r->header().revision(), campaign_sent);
  Leader seen;
  int64_t seen_lease = 0;
  for (const auto& op : r->responses()) {
    if (!op.has_response_range()) continue;
    for (const auto& kv : op.response_range().kvs()) {
      seen = {kv.value(), kv.create_revision()};
      seen_lease = kv.lease();
    }
  }
  // An earlier campaign committed but its answer was lost: the key is this manager's.
  if (seen_lease == lease_ && seen.address == me_) return Elected(seen.term, campaign_sent);
  absl::MutexLock lock(&mu_);
  if (seen.address != leader_.address || seen.term != leader_.term) {
    LOG(INFO) << "manager " << me_ << " standby; leader " << seen.address << " term " << seen.term;
  }
  leader_ = seen;
  trouble_.clear();
}

void LeaderElection::Elected(int64_t term, absl::Time renewal_sent) {
  renewed_ = renewal_sent;
  SetSafeUntil(renewal_sent);
  {
    absl::MutexLock lock(&mu_);
    leader_ = {me_, term};
    trouble_.clear();
  }
  leading_ = true;
  LOG(INFO) << "manager " << me_ << " elected leader, term " << term;
  if (callbacks_.on_elected) callbacks_.on_elected(term);
}

void LeaderElection::Lead() {
  // The lease lives at least ttl from when this renewal was sent (etcd extends it when it
  // handles the request, after this): the safe clock starts here, not at the answer. The
  // call gives up at the safe time, when this manager must stop anyway.
  const absl::Time sent = absl::Now();
  const absl::Time safe_until = absl::FromUnixNanos(safe_until_ns_.load());
  auto t = etcd_->KeepAlive(lease_, safe_until);
  const absl::Time now = absl::Now();
  std::string why;
  if (t.ok() && *t > 0) {
    renewed_ = sent;
    SetSafeUntil(sent);
    if (++ticks_ % 6 == 0) {  // about once a lease: who else is up (varunactl managers)
      if (auto others = etcd_->GetPrefix(prefix_ + "managers/"); others.ok()) {
        absl::MutexLock lock(&mu_);
        managers_.clear();
        for (const EtcdKv& kv : *others) managers_.push_back(kv.value);
      }
    }
  } else if (t.ok()) {
    why = "its lease expired";
  } else if (now >= safe_until) {
    why = absl::StrCat("it could not renew its lease for ",
                       absl::FormatDuration(absl::Trunc(now - renewed_, absl::Milliseconds(100))),
                       " (", t.status().message(), ")");
  }
  if (why.empty()) return;
  leading_ = false;
  lease_ = 0;
  LOG(ERROR) << "manager " << me_ << " is no longer the leader: " << why;
  if (callbacks_.on_deposed) callbacks_.on_deposed(why);
}

}  // namespace varuna

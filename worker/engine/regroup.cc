#include "worker/engine/regroup.h"

#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/pipeline/handover.h"
#include "varuna/v1/worker.pb.h"
#include "worker/dist/torch_status.h"

namespace varuna {
namespace {

// Note [Morph in place]: on a morph the manager sends each survivor, through its agent, the
// new topology, its rank in it and the new rendezvous (ReconfigureCommand). The survivor
// aborts every wait on its old groups (Note [Aborting waits]), so a step blocked on a dead
// peer fails within 50 ms; it then builds its new stage over new groups (the same start-up
// as a launch: rendezvous, dry run, optimizer) while keeping the old engine, and calls
// HandOver: each rank publishes in the new store what it can restore (HandoverOffer: its
// restorable steps with their loss scaler, the layers it holds, the layers it needs), rank 0
// adds the newest complete checkpoint, and every rank computes the same plan (Note
// [Handover] in common/pipeline/handover.cc). Layers move as pickled per-layer state (the
// checkpoint's format: parameters, optimizer state, buffers) as host bytes over the new
// control group (gloo whatever the backend: NCCL refuses host tensors), each sender posting
// all its sends before any rank waits on a receive (gloo's sends do not wait for the
// receiver, so two ranks swapping layers cannot block each other); layers no live rank holds
// are read from the checkpoint. The new engine adopts the step; the old engine is destroyed
// and its groups retired (Note [Retired groups]). Data position is the step, so nothing
// else moves. A joiner (a fresh process of the new generation) takes the same path with
// nothing to offer.

constexpr char kOfferKey[] = "handover/offer/";
constexpr char kCheckpointKey[] = "handover/checkpoint";

std::mutex g_retired_mu;
std::vector<ProcessGroups>* g_retired = new std::vector<ProcessGroups>();  // never destroyed

// Destroys the retired groups nothing runs on any more; returns how many are left.
int ReapLocked() {
  g_retired->erase(std::remove_if(g_retired->begin(), g_retired->end(),
                                  [](ProcessGroups& g) { return !g.abort || g.abort->Idle(); }),
                   g_retired->end());
  return static_cast<int>(g_retired->size());
}

absl::StatusOr<std::string> StoreGet(const ProcessGroups& groups, const std::string& key) {
  std::string out;
  RETURN_IF_ERROR(TorchCall(absl::StrCat("reading ", key, " from the rendezvous store"), [&] {
    std::vector<uint8_t> v = groups.store->get(key);
    out.assign(v.begin(), v.end());
  }));
  return out;
}

absl::Status StoreSet(const ProcessGroups& groups, const std::string& key,
                      const std::string& value) {
  return TorchCall(absl::StrCat("writing ", key, " to the rendezvous store"), [&] {
    groups.store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

constexpr char kAgreedKey[] = "handover/agreed/";
constexpr char kPublishedKey[] = "handover/published";
constexpr char kAllPublishedKey[] = "handover/all_published";

// Note [Roll forward]: a survivor may have posted step N's agreement and never seen it
// complete while others did and applied N (a split: Note [Committed step] in varuna.cc). It
// still holds N's reduced gradients and N - 1's state, and the agreed vector is all N's update
// needs besides them (the overflow, the norm for the clip, the loss, the stop). So before the
// offers every survivor publishes the vector of the newest step whose agreement completed on
// it, every rank waits until all have published, and a rank with N pending applies N with a
// peer's vector (Varuna::RollForward): the survivors then hold N, with nothing copied per
// step to make that possible. With no vector for N (nobody saw N complete), every survivor is
// at N - 1 and the pending gradients are simply dropped with the old engine.
absl::Status RollForwardIfBehind(Varuna* old_engine, const ProcessGroups& groups, int rank,
                                 int world) {
  Checkpointer::CommitRecord mine;
  if (old_engine != nullptr) mine = old_engine->checkpoints().CommitState();
  if (mine.agreed > 0 && !mine.vector.empty()) {
    RETURN_IF_ERROR(StoreSet(groups, absl::StrCat(kAgreedKey, mine.agreed),
                             std::string(reinterpret_cast<const char*>(mine.vector.data()),
                                         mine.vector.size() * sizeof(double))));
  }
  // One counter, and the last to publish says so: O(world) store requests, not O(world^2).
  int64_t published = 0;
  RETURN_IF_ERROR(TorchCall("counting the published agreements",
                            [&] { published = groups.store->add(kPublishedKey, 1); }));
  if (published == world) RETURN_IF_ERROR(StoreSet(groups, kAllPublishedKey, "1"));
  RETURN_IF_ERROR(StoreGet(groups, kAllPublishedKey).status());
  if (mine.pending <= 0) return absl::OkStatus();
  const std::string key = absl::StrCat(kAgreedKey, mine.pending);
  bool known = false;
  RETURN_IF_ERROR(TorchCall(absl::StrCat("looking up ", key, " in the rendezvous store"),
                            [&] { known = groups.store->check({key}); }));
  if (!known) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string bytes, StoreGet(groups, key));
  if (bytes.empty() || bytes.size() % sizeof(double) != 0) {
    return absl::DataLossError(
        absl::StrCat(key, " holds ", bytes.size(), " bytes, not a vector of doubles"));
  }
  std::vector<double> vector(bytes.size() / sizeof(double));
  std::memcpy(vector.data(), bytes.data(), bytes.size());
  RETURN_IF_ERROR(old_engine->RollForward(mine.pending, vector));
  LOG(INFO) << "rank=" << rank << " rolled forward to step " << mine.pending
            << " with a peer's agreement (Note [Roll forward])";
  return absl::OkStatus();
}

// Every rank's hand-over offer, what each holds, and the step of the newest complete
// checkpoint (as rank 0 found it), read back from the new rendezvous store.
struct OfferExchange {
  std::vector<v1::HandoverOffer> offers;  // by new rank
  std::vector<RankHoldings> holdings;     // by new rank, from `offers`
  std::optional<int64_t> ckpt_step;
};

// Publishes this rank's offer (rank 0 also the newest complete checkpoint), then reads all.
absl::StatusOr<OfferExchange> ExchangeOffers(const Varuna* old_engine, const Varuna& engine,
                                             const ProcessGroups& groups, int rank,
                                             const std::string& ckpt_dir) {
  const int world = engine.view().topology().world_size();
  v1::HandoverOffer mine;
  if (old_engine != nullptr) {
    for (const auto& s : old_engine->checkpoints().RestorableSteps()) {
      auto* st = mine.add_steps();
      st->set_step(s.step);
      st->set_loss_scale(s.loss_scale);
      st->set_clean_steps(s.clean_steps);
    }
    for (const auto& name : old_engine->view().layer_names()) mine.add_layers(name);
  }
  for (const auto& name : engine.view().layer_names()) mine.add_needs(name);
  RETURN_IF_ERROR(StoreSet(groups, absl::StrCat(kOfferKey, rank), mine.SerializeAsString()));
  if (rank == 0) {
    std::string value = "none";
    if (!ckpt_dir.empty()) {
      const std::vector<std::string> layers = engine.view().model_layer_names();
      absl::StatusOr<std::optional<int64_t>> newest = ResolveResumeStep(ckpt_dir, {}, &layers);
      if (newest.ok() && *newest) value = absl::StrCat(**newest);
    }
    RETURN_IF_ERROR(StoreSet(groups, kCheckpointKey, value));
  }
  std::vector<v1::HandoverOffer> offers(world);
  std::vector<RankHoldings> holdings(world);
  for (int r = 0; r < world; ++r) {
    ASSIGN_OR_RETURN(std::string bytes, StoreGet(groups, absl::StrCat(kOfferKey, r)));
    if (!offers[r].ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("rank ", r, "'s hand-over offer does not parse"));
    }
    for (const auto& s : offers[r].steps()) holdings[r].steps.push_back(s.step());
    holdings[r].layers.assign(offers[r].layers().begin(), offers[r].layers().end());
    holdings[r].needs.assign(offers[r].needs().begin(), offers[r].needs().end());
  }
  ASSIGN_OR_RETURN(std::string ckpt_text, StoreGet(groups, kCheckpointKey));
  std::optional<int64_t> ckpt_step;
  if (int64_t s = 0; absl::SimpleAtoi(ckpt_text, &s)) ckpt_step = s;
  return OfferExchange{std::move(offers), std::move(holdings), ckpt_step};
}

// Moves the layers of `plan.moves` that this rank sends (from `held`) or receives (into
// `state`, counting the bytes in `stats`). Every sender posts all its sends before any rank
// waits on a receive (Note [Morph in place]), so no pair of ranks waits on each other.
absl::Status MoveLayers(const Handover& plan, const std::optional<Checkpointer::HeldState>& held,
                        const ProcessGroups& groups, int rank, Checkpointer::HeldState* state,
                        HandoverStats* stats) {
  struct Outgoing {
    torch::Tensor size, data;
    WorkPtr size_work, data_work;
  };
  std::vector<Outgoing> outgoing;
  RETURN_IF_ERROR(TorchCall("sending layers", [&]() -> absl::Status {
    for (size_t i = 0; i < plan.moves.size(); ++i) {
      const Handover::Move& m = plan.moves[i];
      if (m.src != rank) continue;
      if (!held) return absl::InternalError("asked to send a step this rank does not hold");
      auto it = held->layers.find(m.layer);
      if (it == held->layers.end()) {
        return absl::InternalError(absl::StrCat("asked to send ", m.layer, ", not held here"));
      }
      std::vector<char> bytes = torch::pickle_save(it->second);
      Outgoing o;
      o.size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
      o.data = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
      std::memcpy(o.data.data_ptr(), bytes.data(), bytes.size());
      const int tag = static_cast<int>(2 * i);
      o.size_work = groups.control->Send(o.size, m.dst, tag);
      o.data_work = groups.control->Send(o.data, m.dst, tag + 1);
      outgoing.push_back(std::move(o));
    }
    return absl::OkStatus();
  }));
  // Receives, in the plan's order.
  return TorchCall("receiving layers", [&]() -> absl::Status {
    for (size_t i = 0; i < plan.moves.size(); ++i) {
      const Handover::Move& m = plan.moves[i];
      if (m.dst != rank) continue;
      const int tag = static_cast<int>(2 * i);
      torch::Tensor size = torch::zeros({1}, torch::kInt64);
      groups.control->Recv(size, m.src, tag)->Wait(groups.timeout);
      const int64_t n = size.item<int64_t>();
      if (n <= 0 || static_cast<uint64_t>(n) > kMaxCheckpointFileBytes) {
        return absl::DataLossError(
            absl::StrCat("rank ", m.src, " announced ", n, " bytes for ", m.layer));
      }
      torch::Tensor data = torch::empty({n}, torch::kUInt8);
      groups.control->Recv(data, m.src, tag + 1)->Wait(groups.timeout);
      std::vector<char> bytes(n);
      std::memcpy(bytes.data(), data.data_ptr(), n);
      ASSIGN_OR_RETURN(auto dict,
                       UnpickleLayer(bytes, absl::StrCat(m.layer, " from rank ", m.src)));
      state->layers.emplace(m.layer, std::move(dict));
      stats->moved_bytes += n;
    }
    for (auto& o : outgoing) {
      o.size_work->Wait(groups.timeout);
      o.data_work->Wait(groups.timeout);
    }
    return absl::OkStatus();
  });
}

// Reads the layers of `plan.reads` for this rank from the checkpoint at `ckpt_path`.
absl::Status ReadCheckpointLayers(const Handover& plan, const std::string& ckpt_path, int rank,
                                  Checkpointer::HeldState* state, HandoverStats* stats) {
  int format = 0;  // the checkpoint's layer-file format, read with the first layer wanted
  for (const auto& read : plan.reads) {
    if (read.dst != rank) continue;
    if (format == 0) {
      ASSIGN_OR_RETURN(CheckpointCommon common, ReadCheckpointCommon(ckpt_path));
      format = common.format;
    }
    const std::string file = absl::StrCat(ckpt_path, "/", LayerFileOf(format, read.layer));
    if (RolledLayer(ckpt_path, format, read.layer)) {
      // Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc: only a load applies the
      // step's update to it; the hand-over fails and the job relaunches, which loads it.
      return absl::FailedPreconditionError(absl::StrCat(
          ckpt_path, " holds layer ", read.layer,
          " only with the gradients of its step (a rolled rescue), which a hand-over does not "
          "apply: the job relaunches from it instead"));
    }
    ASSIGN_OR_RETURN(auto dict, ReadLayerFile(file, &stats->checkpoint_bytes_read));
    state->layers.emplace(read.layer, std::move(dict));
  }
  return absl::OkStatus();
}

}  // namespace

void RegroupMailbox::Start(bool in_place, int generation) {
  std::lock_guard<std::mutex> l(mu_);
  in_place_.store(in_place);
  generation_ = generation;
}

void RegroupMailbox::SetCurrentAbort(std::shared_ptr<AbortSignal> abort) {
  std::lock_guard<std::mutex> l(mu_);
  abort_ = std::move(abort);
}

void RegroupMailbox::Post(const v1::ReconfigureCommand& r) {
  std::shared_ptr<AbortSignal> abort;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (r.generation() <= generation_) {
      LOG(WARNING) << "reconfigure to generation " << r.generation() << " ignored: this worker "
                   << "is in generation " << generation_;
      return;
    }
    LOG(INFO) << "the agent asks to regroup in place into generation " << r.generation()
              << " as rank " << r.rank() << " of " << r.pipelines();
    posted_ = r;
    abort = abort_;
  }
  if (abort) abort->Abort();
}

bool RegroupMailbox::Pending() const {
  std::lock_guard<std::mutex> l(mu_);
  return posted_.has_value();
}

std::optional<v1::ReconfigureCommand> RegroupMailbox::Wait(double timeout_s,
                                                           const std::atomic<bool>& give_up) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && !give_up.load()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (posted_) return posted_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

void RegroupMailbox::Done(int generation) {
  std::shared_ptr<AbortSignal> newer;
  {
    std::lock_guard<std::mutex> l(mu_);
    // A reconfigure to a later generation may have come while this one was handed over: it
    // stays posted, and the new generation's groups (SetCurrentAbort was called first) are
    // aborted, so the first step fails at once and the worker regroups again.
    if (posted_ && posted_->generation() <= generation) posted_.reset();
    generation_ = generation;
    park_on_stop_.store(false);
    if (posted_) newer = abort_;
  }
  if (newer) newer->Abort();
}

int RegroupMailbox::generation() const {
  std::lock_guard<std::mutex> l(mu_);
  return generation_;
}

// Note [Retired groups]: a generation's groups are retired when a morph in place replaces
// them. They are aborted first (Note [Aborting waits] in worker/dist/process_group.h), which
// ends every point-to-point work at once; a gloo collective cannot be aborted and runs on the
// group's threads until it ends or times out, and destroying its group would wait for that.
// So every work posted on the groups is registered until it is done, and a retired generation
// is destroyed (its sockets, threads, buffers, an NCCL group's communicators) as soon as none
// is in flight: at once after a clean stop, after the stuck collective's own timeout
// otherwise, checked again at every retirement (RetiredGroupsAlive). Before this, every
// generation's groups lived until the process ended.
void RetireGroups(ProcessGroups groups) {
  if (groups.abort) groups.abort->Abort();
  std::lock_guard<std::mutex> l(g_retired_mu);
  g_retired->push_back(std::move(groups));
  const int alive = ReapLocked();
  if (alive > 0) LOG(INFO) << alive << " retired generation(s) of groups wait for a collective";
}

int RetiredGroupsAlive() {
  std::lock_guard<std::mutex> l(g_retired_mu);
  return ReapLocked();
}

absl::StatusOr<HandoverStats> HandOver(Varuna* old_engine, Varuna& engine,
                                       const ProcessGroups& groups, int rank,
                                       const std::string& ckpt_dir) {
  if (!groups.store) return absl::FailedPreconditionError("HandOver needs a rendezvous store");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // 1. A survivor that missed the newest agreement rolls forward (Note [Roll forward]); offers.
  RETURN_IF_ERROR(
      RollForwardIfBehind(old_engine, groups, rank, engine.view().topology().world_size()));
  ASSIGN_OR_RETURN(OfferExchange exchange,
                   ExchangeOffers(old_engine, engine, groups, rank, ckpt_dir));
  const std::vector<v1::HandoverOffer>& offers = exchange.offers;
  const std::vector<RankHoldings>& holdings = exchange.holdings;
  const std::optional<int64_t>& ckpt_step = exchange.ckpt_step;

  // 2. The plan, the same on every rank.
  ASSIGN_OR_RETURN(Handover plan, PlanHandover(holdings, ckpt_step));
  HandoverStats stats;
  stats.step = plan.step;
  stats.reason = plan.reason;
  const auto t1 = Clock::now();
  stats.agree_s = std::chrono::duration<double>(t1 - t0).count();
  Checkpointer::HeldState state;
  state.step = plan.step;
  bool scaler_known = false;
  for (const auto& o : offers) {
    for (const auto& s : o.steps()) {
      if (s.step() == plan.step && !scaler_known) {
        state.loss_scale = s.loss_scale();
        state.clean_steps = s.clean_steps();
        scaler_known = true;
      }
    }
  }
  const std::string ckpt_path =
      ckpt_step && *ckpt_step == plan.step ? CheckpointPath(ckpt_dir, plan.step) : "";
  if (!scaler_known) {
    if (ckpt_path.empty()) return absl::InternalError("hand-over step with no loss scaler");
    ASSIGN_OR_RETURN(CheckpointCommon common, ReadCheckpointCommon(ckpt_path));
    state.loss_scale = common.loss_scale;
    state.clean_steps = common.clean_steps;
  }

  // 3. What this rank keeps and sends, at the agreed step.
  std::optional<Checkpointer::HeldState> held;
  const bool holds_step =
      old_engine != nullptr && std::find(holdings[rank].steps.begin(), holdings[rank].steps.end(),
                                         plan.step) != holdings[rank].steps.end();
  if (holds_step) {
    ASSIGN_OR_RETURN(held, old_engine->checkpoints().HeldAt(plan.step));
    for (const auto& name : engine.view().layer_names()) {
      auto it = held->layers.find(name);
      if (it != held->layers.end()) state.layers.emplace(name, it->second);
    }
  }
  // 4. The moves: this rank's sends, then its receives in the plan's order.
  RETURN_IF_ERROR(MoveLayers(plan, held, groups, rank, &state, &stats));
  // 5. What no live rank holds, from the checkpoint of the agreed step.
  RETURN_IF_ERROR(ReadCheckpointLayers(plan, ckpt_path, rank, &state, &stats));
  RETURN_IF_ERROR(engine.checkpoints().Adopt(state));
  stats.transfer_s = std::chrono::duration<double>(Clock::now() - t1).count();
  return stats;
}

}  // namespace varuna

#include "worker/engine/checkpoint.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <torch/serialize.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/safe_file.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_store.h"
#include "worker/dist/torch_status.h"
#include "worker/models/layer_file.h"

namespace varuna {
namespace {

// The optimizer's key for a parameter's state: the address of its TensorImpl.
void* StateKey(const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }

// `t` on the host for a snapshot, as `dtype` (Note [Rescue copies]): a CPU tensor itself when
// `borrow` (the caller writes it before the state changes again) or else a copy; a device
// tensor's copy into pinned memory, queued on the current stream (the caller synchronizes it).
at::Tensor OnHost(const at::Tensor& t, bool borrow, at::ScalarType dtype) {
  const at::Tensor d = t.detach();
  if (d.device().is_cpu()) {
    if (d.scalar_type() != dtype) return d.to(dtype);
    return borrow ? d : d.clone();
  }
  at::Tensor host =
      at::empty(d.sizes(), d.options().device(torch::kCPU).dtype(dtype).pinned_memory(true));
  host.copy_(d, /*non_blocking=*/true);
  return host;
}
at::Tensor OnHost(const at::Tensor& t, bool borrow) { return OnHost(t, borrow, t.scalar_type()); }

// Optimizer state of one parameter as named tensors ("<kind>.<field>").
void SaveOptimizerState(torch::optim::Optimizer& opt, const torch::Tensor& p,
                        const std::string& name, bool borrow,
                        c10::Dict<std::string, at::Tensor>* out) {
  auto it = opt.state().find(StateKey(p));
  if (it == opt.state().end()) return;
  auto* s = it->second.get();
  if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
    out->insert("opt." + name + ".step", torch::tensor(a->step()));
    out->insert("opt." + name + ".exp_avg", OnHost(a->exp_avg(), borrow));
    out->insert("opt." + name + ".exp_avg_sq", OnHost(a->exp_avg_sq(), borrow));
  } else if (auto* b = dynamic_cast<torch::optim::AdamParamState*>(s)) {
    out->insert("opt." + name + ".step", torch::tensor(b->step()));
    out->insert("opt." + name + ".exp_avg", OnHost(b->exp_avg(), borrow));
    out->insert("opt." + name + ".exp_avg_sq", OnHost(b->exp_avg_sq(), borrow));
  } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
    if (g->momentum_buffer().defined()) {
      out->insert("opt." + name + ".momentum_buffer", OnHost(g->momentum_buffer(), borrow));
    }
  }
}

void LoadOptimizerState(torch::optim::Optimizer& opt, const torch::Tensor& p,
                        const std::string& name, const c10::Dict<std::string, at::Tensor>& in) {
  const std::string prefix = "opt." + name + ".";
  auto get = [&](const std::string& field) -> torch::Tensor {
    auto it = in.find(prefix + field);
    return it == in.end() ? torch::Tensor() : it->value().to(p.device()).clone();
  };
  const torch::Tensor step = get("step"), avg = get("exp_avg"), sq = get("exp_avg_sq");
  const torch::Tensor mom = get("momentum_buffer");
  if (dynamic_cast<torch::optim::AdamW*>(&opt) && avg.defined()) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step.item<int64_t>()).exp_avg(avg).exp_avg_sq(sq);
    opt.state()[StateKey(p)] = std::move(s);
  } else if (dynamic_cast<torch::optim::Adam*>(&opt) && avg.defined()) {
    auto s = std::make_unique<torch::optim::AdamParamState>();
    s->step(step.item<int64_t>()).exp_avg(avg).exp_avg_sq(sq);
    opt.state()[StateKey(p)] = std::move(s);
  } else if (dynamic_cast<torch::optim::SGD*>(&opt) && mom.defined()) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(mom);
    opt.state()[StateKey(p)] = std::move(s);
  }
}

// The per-layer keys that hold a slice of a sharded parameter with tensor parallelism: the
// parameter and its optimizer state of SaveOptimizerState's shapes (Adam's step is a scalar).
std::vector<std::string> ShardedKeys(const std::string& name) {
  return {"param." + name, "opt." + name + ".exp_avg", "opt." + name + ".exp_avg_sq",
          "opt." + name + ".momentum_buffer"};
}

// Which of this rank's layers it writes (`mine`) and the ranks that write any (for
// common.json's writer list).
struct CheckpointWrites {
  std::vector<bool> mine;
  std::set<int> writers;
};

CheckpointWrites AssignCheckpointWrites(const Topology& topo, const Model& model,
                                        const std::vector<std::shared_ptr<Layer>>& layers,
                                        const std::vector<std::string>& layer_names, int rank,
                                        bool shard) {
  const int replica = topo.PipelineOf(rank);
  // Note [Sharded writes]: pipeline 0 holds every layer once, so by default its ranks write
  // them all. With shard, each layer goes to one of its holders (one rank per pipeline):
  // uniform topologies balance a stage's layers over its replicas by bytes (largest first,
  // to the least-loaded replica, ties to the lower one); heterogeneous ones take model layer
  // i's holder in pipeline i mod D. Every rank computes the same assignment locally.
  std::vector<bool> mine(layers.size(), !shard && replica == 0);
  const int D = topo.num_pipelines();
  if (shard && topo.uniform()) {
    std::vector<int64_t> bytes(layers.size(), 0);
    for (size_t i = 0; i < layers.size(); ++i) {
      for (const auto& p : layers[i]->parameters()) bytes[i] += p.numel() * 4;
    }
    std::vector<size_t> order(layers.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
    std::vector<int64_t> load(D, 0);
    for (size_t i : order) {
      const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[r] += bytes[i];
      mine[i] = r == replica;
    }
  }
  // The writer list for common.json (and, sharded heterogeneous, this rank's layers).
  const auto segments = model.Segments();
  const PipelineLayout& first = topo.pipeline(0);
  std::set<int> writers;
  int model_layer = 0;
  for (size_t sg = 0; sg < segments.size(); ++sg) {
    const std::vector<int> holders = topo.Holders(static_cast<int>(sg));
    for (size_t j = 0; j < segments[sg].size(); ++j, ++model_layer) {
      if (!shard) {
        writers.insert(holders[0]);
      } else if (!topo.uniform()) {
        const int w = holders[model_layer % D];
        writers.insert(w);
        for (size_t i = 0; i < layers.size() && w == rank; ++i) {
          if (layer_names[i] == model.layers()[segments[sg][j]].name) mine[i] = true;
        }
      }
    }
  }
  if (shard && topo.uniform()) {
    // The greedy assignment gives each of the first min(D, layers) replicas of a stage at
    // least one layer.
    for (int s = 0; s < first.stages(); ++s) {
      int stage_layers = 0;
      for (int sg = first.boundaries[s]; sg < first.boundaries[s + 1]; ++sg) {
        stage_layers += static_cast<int>(segments[sg].size());
      }
      for (int d = 0; d < std::min(D, stage_layers); ++d)
        writers.insert(topo.pipeline(d).first_rank + s);
    }
  }
  return CheckpointWrites{std::move(mine), std::move(writers)};
}

}  // namespace

Checkpointer::~Checkpointer() {
  if (upload_.thread.joinable()) upload_.thread.join();
}

int64_t Checkpointer::committed_step() const {
  return state_->commit.Committed(state_->iteration, stage_->topology.world_size());
}

// Note [Rescue copies]: a rescue copies this rank's state to the host while its step may be
// stuck in a collective that waits for a dead peer. On the compute stream those copies would
// queue behind that collective and wait for its timeout (or forever). The state does not
// change after its last update (the next one needs the state's lock, which the snapshot holds),
// so the copies need only that update to be done: each change to the state records
// TrainingState::changed on the compute stream, and the snapshot runs on a side stream from
// the pool that waits for that event and nothing else. Periodic checkpoints take the same road
// (they too then skip whatever the compute stream has queued since), and a rolled rescue's
// gradients one behind TrainingState::grads_ready.
namespace {

torch::Device StageDevice(const RankStage& stage) {
  return stage.named_params.empty() ? torch::Device(torch::kCPU)
                                    : stage.named_params.front().second.device();
}

}  // namespace

const c10::Event* ChangedEvent(const TrainingState& state) {
  return state.changed ? &*state.changed : nullptr;
}

namespace {

void RecordOnComputeStream(std::optional<c10::Event>* event, torch::Device device) {
  if (device.is_cpu()) return;
  if (!*event) event->emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);
  c10::impl::VirtualGuardImpl impl(device.type());
  (*event)->record(impl.getStream(device));
}

}  // namespace

void MarkStateChanged(TrainingState& state, torch::Device device) {
  RecordOnComputeStream(&state.changed, device);
}

void MarkGradientsReady(TrainingState& state, torch::Device device) {
  RecordOnComputeStream(&state.grads_ready, device);
}

namespace {

// Runs `copy`, which queues copies of `device`'s tensors to pinned host memory, on a side
// stream that waits for `after` alone (Note [Rescue copies]; without it, on the current
// stream), then waits for those copies. On the CPU it just runs `copy`.
absl::Status CopyToHost(torch::Device device, const c10::Event* after, const std::string& what,
                        const std::function<void()>& copy) {
  return TorchCall(what, [&] {
    std::optional<c10::StreamGuard> side;
    if (after != nullptr && after->device_type() != c10::DeviceType::CPU) {
      c10::impl::VirtualGuardImpl impl(after->device_type());
      const c10::Stream stream = impl.getStreamFromGlobalPool(
          c10::Device(after->device_type(), after->device_index()), /*isHighPriority=*/true);
      after->block(stream);
      side.emplace(stream);
    }
    copy();
    if (!device.is_cpu()) {  // the pinned copies were queued: wait for them
      c10::impl::VirtualGuardImpl impl(device.type());
      impl.getStream(device).synchronize();
    }
  });
}

}  // namespace

absl::StatusOr<LayerSnapshot> SnapshotLayers(const RankStage& stage,
                                             torch::optim::Optimizer& optimizer,
                                             const std::vector<bool>& mine, const c10::Event* after,
                                             bool borrow) {
  LayerSnapshot snapshot;
  RETURN_IF_ERROR(CopyToHost(StageDevice(stage), after, "snapshotting the stage", [&] {
    for (size_t i = 0; i < stage.layers.size(); ++i) {
      if (!mine[i]) continue;
      c10::Dict<std::string, at::Tensor> d;
      for (const auto& p : stage.layers[i]->named_parameters(/*recurse=*/true)) {
        d.insert("param." + p.key(), OnHost(p.value(), borrow, torch::kFloat));
        SaveOptimizerState(optimizer, p.value(), p.key(), borrow, &d);
      }
      for (const auto& b : stage.layers[i]->named_buffers(/*recurse=*/true)) {
        d.insert("buffer." + b.key(), OnHost(b.value(), borrow));
      }
      snapshot.emplace_back(stage.layer_names[i], std::move(d));
    }
  }));
  return snapshot;
}

std::string Checkpointer::CommonJson(const std::vector<int>& writers,
                                     const std::map<std::string, std::string>& info) const {
  const int64_t step = state_->iteration;
  const double loss_scale = state_->scaler.scale();
  const int64_t clean_steps = state_->scaler.clean_steps();
  CheckpointCommon c;
  c.step = step;
  c.global_batch = stage_->topology.global_batch();
  c.stages = stage_->topology.pipeline(0).stages();
  c.replicas = stage_->topology.num_pipelines();
  c.world = stage_->topology.world_size();
  c.micro_batch = stage_->chunk_size;
  c.stage_to_rank_map = stage_->topology.uniform() ? stage_->topology.ToStageMap().ToString() : "";
  c.pipelines = stage_->topology.ToString();
  c.loss_scale = loss_scale;
  c.clean_steps = clean_steps;
  c.writers = writers;
  for (const auto& layer : stage_->model.layers()) c.layers.push_back(layer.name);
  return FormatCheckpointCommon(c, info);
}

// Note [Rescue]: a survivor of a failed step saves the state of its last completed step
// without any collective (its peers may be gone): every layer of its stage, plus
// rescue.rank<R>.json (the common fields and its files' digests) and rescued.rank<R> last.
// Replicas of a stage hold identical state, so two of them writing the same layer file
// write the same bytes. The checkpoint is complete when the rescuers' layers cover the
// model (VerifyCheckpoint); the next generation loads it like any other. The state's lock
// (TrainingState::mu) keeps the snapshot off a half-applied optimizer step when this runs on
// another thread.
absl::StatusOr<int64_t> Checkpointer::Rescue(const std::string& dir, const InfoAt& info) {
  std::lock_guard<std::mutex> state(state_->mu);
  if (!state_->optimizer) return absl::FailedPreconditionError("Rescue() before set_optimizer()");
  absl::Status upload = Wait();
  if (!upload.ok()) LOG(WARNING) << "rank=" << stage_->rank << " earlier upload failed: " << upload;
  rescued_pending_ = 0;
  faults_->Hit(FaultPoint::kRescueSave, state_->iteration);
  const int64_t step = state_->iteration;
  // With the next step's agreement posted, this rank's gradients of that step are what a
  // peer's record of its update needs to bring this stage there (Note [Rolled rescue] in
  // common/checkpoint/checkpoint_store.cc).
  const int64_t pending = rolled_rescue_ && state_->commit.pending() == step + 1 ? step + 1 : 0;
  if (step == 0 && pending == 0) return 0;  // nothing trained since a fresh start
  if (stage_->tp.enabled()) {
    // A rescue runs without collectives and a tp rank holds a slice: it cannot write full
    // tensors alone.
    return absl::FailedPreconditionError(
        absl::StrCat("no rescue with tensor parallelism (tp_size ", stage_->tp.size,
                     "): the job resumes from its last periodic checkpoint"));
  }
  LayerSnapshot snapshot;
  auto take = [&]() -> absl::Status {
    if (!snapshot.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(snapshot, SnapshotLayers(*stage_, *state_->optimizer,
                                              std::vector<bool>(stage_->layers.size(), true),
                                              ChangedEvent(*state_), /*borrow=*/true));
    return absl::OkStatus();
  };
  // Already saved (a periodic checkpoint of this step, or the rescues of this generation's
  // peers): nothing to add, and a record rewritten here could lose what an earlier
  // generation's rescuer recorded under the same rank (its step's update).
  if (step > 0 && !VerifyCheckpoint(CheckpointPath(dir, step), /*checksums=*/false).ok()) {
    RETURN_IF_ERROR(take());
    std::map<std::string, std::string> fields =
        info ? info(step) : std::map<std::string, std::string>();
    if (rolled_rescue_ && state_->commit.agreed() == step) {  // what a peer behind needs
      const StepCommit::Update& u = state_->commit.agreed_update();
      fields["update_skipped"] = u.skipped ? "1" : "0";
      fields["update_grad_norm"] = absl::StrFormat("%.17g", u.grad_norm);
      if (generation_ > 0) fields["generation"] = absl::StrCat(generation_);
    }
    RETURN_IF_ERROR(WriteRescue(dir, step, snapshot, CommonJson({stage_->rank}, fields)));
  }
  if (pending > 0) {
    // The step's own save stands whatever happens here: the pending layers only help.
    absl::Status st = take();
    if (st.ok()) st = WritePending(dir, pending, std::move(snapshot));
    if (st.ok()) {
      rescued_pending_ = pending;
    } else {
      LOG(WARNING) << "rank=" << stage_->rank << " wrote no pending layers for step " << pending
                   << ": " << st;
    }
  }
  return step;
}

absl::Status Checkpointer::WritePending(const std::string& dir, int64_t step,
                                        LayerSnapshot layers) {
  // The gradients were final on the compute stream when the agreement was posted: copy behind
  // that event alone. Not reached yet, the reductions never finished here, so no peer can have
  // completed the agreement either (theirs needed this rank's): nothing to offer.
  const c10::Event* ready = state_->grads_ready ? &*state_->grads_ready : nullptr;
  if (ready != nullptr && !ready->query()) {
    return absl::UnavailableError("its gradients never finished reducing");
  }
  RETURN_IF_ERROR(CopyToHost(StageDevice(*stage_), ready, "snapshotting the gradients", [&] {
    for (size_t i = 0; i < stage_->layers.size(); ++i) {
      for (const auto& p : stage_->layers[i]->named_parameters(/*recurse=*/true)) {
        if (!p.value().grad().defined()) continue;  // frozen: nothing to update
        layers[i].second.insert_or_assign("grad." + p.key(),
                                          OnHost(p.value().grad(), /*borrow=*/true, torch::kFloat));
      }
    }
  }));
  const std::string path = CheckpointPath(dir, step);
  std::error_code ec;
  std::filesystem::create_directories(path + "/pending", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  ASSIGN_OR_RETURN(std::vector<FileDigest> written,
                   WriteLayerFiles(path, layers, stage_->rank, /*pending=*/true));
  return WritePendingRecord(path, stage_->rank, step, stage_->topology.global_batch(),
                            stage_->layer_names, written, generation_);
}

std::vector<Checkpointer::RestorableStep> Checkpointer::RestorableSteps() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return {{state_->iteration, state_->scaler.scale(), state_->scaler.clean_steps()}};
}

Checkpointer::CommitRecord Checkpointer::CommitState() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return CommitRecord{state_->commit.agreed(), state_->commit.agreed_vector(),
                      state_->commit.pending()};
}

absl::StatusOr<Checkpointer::HeldState> Checkpointer::HeldAt(int64_t step) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (stage_->tp.enabled()) {
    return absl::FailedPreconditionError(
        "a morph in place hands over full layers; a tensor-parallel rank holds a slice");
  }
  HeldState out;
  out.step = step;
  LayerSnapshot snapshot;
  if (step != state_->iteration) {
    return absl::NotFoundError(absl::StrCat("rank ", stage_->rank, " holds no state of step ", step,
                                            " (it is at step ", state_->iteration, ")"));
  }
  if (!state_->optimizer) return absl::FailedPreconditionError("HeldAt() before set_optimizer()");
  ASSIGN_OR_RETURN(snapshot, SnapshotLayers(*stage_, *state_->optimizer,
                                            std::vector<bool>(stage_->layers.size(), true),
                                            ChangedEvent(*state_)));
  out.loss_scale = state_->scaler.scale();
  out.clean_steps = state_->scaler.clean_steps();
  for (auto& [name, dict] : snapshot) out.layers.emplace(std::move(name), std::move(dict));
  return out;
}

absl::Status Checkpointer::Adopt(const HeldState& state) {
  if (!state_->optimizer) return absl::FailedPreconditionError("Adopt() before set_optimizer()");
  std::lock_guard<std::mutex> lock(state_->mu);
  for (size_t i = 0; i < stage_->layers.size(); ++i) {
    auto it = state.layers.find(stage_->layer_names[i]);
    if (it == state.layers.end()) {
      return absl::InternalError(absl::StrCat("rank ", stage_->rank, " got no state for layer ",
                                              stage_->layer_names[i], " of step ", state.step));
    }
    RETURN_IF_ERROR(LoadLayer(i, it->second, absl::StrCat("layer ", stage_->layer_names[i])));
  }
  state_->scaler.Restore(state.loss_scale, state.clean_steps);
  state_->iteration = state.step;
  MarkStateChanged(*state_, StageDevice(*stage_));
  state_->commit.Start(
      state.step);  // every rank of the generation adopted it (Note [Committed step])
  return absl::OkStatus();
}

absl::Status Checkpointer::WriteRescue(const std::string& dir, int64_t step,
                                       const LayerSnapshot& layers,
                                       const std::string& common_json) {
  const std::string path = CheckpointPath(dir, step);
  std::error_code ec;
  std::filesystem::create_directories(path + "/layers", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  ASSIGN_OR_RETURN(std::vector<FileDigest> written, WriteLayerFiles(path, layers, stage_->rank));
  return WriteRescueRecord(path, stage_->rank, common_json, written);
}

// Note [Background upload]: the training thread writes this rank's files (Note [Writes at disk
// speed] in common/checkpoint/safetensors.cc, from the state itself: no copy). Without a
// tempdir they go to `dir` and the manifest and marker follow at once. With one they go to
// local disk, and a background thread copies them to `dir` (each checked against the CRC taken
// while writing it) and writes the manifest and marker only after every file landed and was
// fsynced. Training continues meanwhile; the next checkpoint (or Wait()) waits for it.
absl::Status Checkpointer::Save(const std::string& dir,
                                const std::map<std::string, std::string>& info,
                                const std::string& tempdir, bool shard) {
  std::lock_guard<std::mutex> state(state_->mu);
  if (!state_->optimizer) return absl::FailedPreconditionError("Save() before set_optimizer()");
  RETURN_IF_ERROR(Wait());
  const std::string path = CheckpointPath(dir, state_->iteration);
  const std::string stage_path =
      tempdir.empty()
          ? path
          : absl::StrCat(CheckpointPath(tempdir, state_->iteration), ".rank", stage_->rank);
  std::error_code ec;
  for (const std::string& p : {path, stage_path}) {
    std::filesystem::create_directories(p + "/layers", ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", p, ": ", ec.message()));
  }
  faults_->Hit(FaultPoint::kCheckpointWrite, state_->iteration);
  // Note [Sharded writes].
  CheckpointWrites assigned = AssignCheckpointWrites(
      stage_->topology, stage_->model, stage_->layers, stage_->layer_names, stage_->rank, shard);
  std::vector<bool>& mine = assigned.mine;
  const std::set<int>& writers = assigned.writers;
  bool writer = std::find(mine.begin(), mine.end(), true) != mine.end();
  LayerSnapshot snapshot;
  if (writer) {
    // Written before this returns (to `dir`, or to the tempdir the upload reads): the state's
    // own CPU tensors, no copy (the state's lock is held throughout).
    ASSIGN_OR_RETURN(snapshot, SnapshotLayers(*stage_, *state_->optimizer, mine,
                                              ChangedEvent(*state_), /*borrow=*/true));
    // Every tp rank of a writer gathers; its tp rank 0 writes the full tensors.
    if (stage_->tp.enabled()) RETURN_IF_ERROR(GatherShards(mine, &snapshot));
  }
  if (stage_->tp.rank != 0) {
    writer = false;
    snapshot.clear();
  }
  std::string json;
  if (stage_->rank == 0 && stage_->tp.rank == 0) {
    json = CommonJson(std::vector<int>(writers.begin(), writers.end()), info);
  }
  const int rank = stage_->rank;
  const bool upload = !tempdir.empty();
  std::vector<FileDigest> written;
  absl::Status local = [&]() -> absl::Status {
    if (writer) {
      ASSIGN_OR_RETURN(written, WriteLayerFiles(stage_path, snapshot, rank));
    }
    if (!json.empty()) {
      RETURN_IF_ERROR(WriteFileAtomic(stage_path + "/common.json", json, rank));
      written.push_back(DigestBytes("common.json", json));
    }
    return absl::OkStatus();
  }();
  snapshot.clear();
  if (!local.ok()) {
    if (upload) std::filesystem::remove_all(stage_path, ec);
    return local;
  }
  auto write_all = [path, stage_path, writer, rank, upload,
                    written = std::move(written)]() -> absl::Status {
    if (upload) {
      for (const FileDigest& f : written) {
        std::ifstream in(absl::StrCat(stage_path, "/", f.path), std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        // The local copy is checked against the digest taken while writing it.
        if (DigestBytes(f.path, bytes).crc32 != f.crc32) {
          return absl::DataLossError(absl::StrCat("local copy of ", f.path, " was corrupted"));
        }
        RETURN_IF_ERROR(WriteFileAtomic(absl::StrCat(path, "/", f.path), bytes, rank));
      }
    }
    if (writer) RETURN_IF_ERROR(WriteManifestAndMarker(path, rank, written));
    return absl::OkStatus();
  };
  if (!upload) return write_all();
  upload_.thread = std::thread([this, write_all = std::move(write_all), stage_path, rank] {
    absl::Status st = write_all();
    std::error_code ec;
    std::filesystem::remove_all(stage_path, ec);
    if (!st.ok()) LOG(ERROR) << "rank=" << rank << " checkpoint upload failed: " << st;
    std::lock_guard<std::mutex> l(upload_.mu);
    upload_.status = st;
  });
  return absl::OkStatus();
}

absl::Status Checkpointer::Wait() {
  {
    std::lock_guard<std::mutex> j(upload_.join_mu);
    if (upload_.thread.joinable()) upload_.thread.join();
  }
  std::lock_guard<std::mutex> l(upload_.mu);
  absl::Status st = upload_.status;
  upload_.status = absl::OkStatus();
  return st;
}

absl::Status Checkpointer::GatherShards(const std::vector<bool>& mine,
                                        LayerSnapshot* snapshot) const {
  size_t k = 0;
  for (size_t i = 0; i < stage_->layers.size(); ++i) {
    if (!mine[i]) continue;
    c10::Dict<std::string, at::Tensor>& d = (*snapshot)[k++].second;
    for (const auto& [name, spec] : stage_->layer_shards[i]) {
      for (const std::string& key : ShardedKeys(name)) {
        auto it = d.find(key);
        if (it == d.end()) continue;
        ASSIGN_OR_RETURN(std::vector<torch::Tensor> parts, AllGather(it->value(), stage_->tp));
        RETURN_IF_ERROR(
            TorchCall("joining shards", [&] { d.insert_or_assign(key, JoinShards(parts, spec)); }));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::LoadLayer(size_t i, const c10::Dict<std::string, at::Tensor>& in,
                                     const std::string& what) {
  return TorchCall(absl::StrCat("loading ", what), [&]() -> absl::Status {
    torch::NoGradGuard g;
    // A checkpoint holds full tensors; a sharded parameter and its optimizer state take this
    // rank's slice (Note [Tensor parallelism]).
    c10::Dict<std::string, at::Tensor> local = in;
    if (stage_->tp.enabled()) {
      local = in.copy();
      for (const auto& [name, spec] : stage_->layer_shards[i]) {
        for (const std::string& key : ShardedKeys(name)) {
          auto it = in.find(key);
          if (it == in.end()) continue;
          const int64_t dim = spec.dim, n = it->value().dim() > dim ? it->value().size(dim) : 0;
          if (n % (spec.blocks * stage_->tp.size) != 0) {
            return absl::FailedPreconditionError(
                absl::StrCat(what, ": '", key, "' has ", n, " rows along dimension ", dim,
                             ", which do not split over tp_size ", stage_->tp.size));
          }
          local.insert_or_assign(key,
                                 TakeShard(it->value(), spec, stage_->tp.size, stage_->tp.rank));
        }
      }
    }
    for (auto& p : stage_->layers[i]->named_parameters(/*recurse=*/true)) {
      auto it = local.find("param." + p.key());
      if (it == local.end() || !it->value().sizes().equals(p.value().sizes())) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " has no parameter '", p.key(), "' of shape ", c10::str(p.value().sizes()),
            ": the model spec differs from the one that wrote the checkpoint"));
      }
      p.value().copy_(it->value());
      LoadOptimizerState(*state_->optimizer, p.value(), p.key(), local);
    }
    for (auto& b : stage_->layers[i]->named_buffers(/*recurse=*/true)) {
      auto it = in.find("buffer." + b.key());
      if (it != in.end()) b.value().copy_(it->value());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> Checkpointer::Load(const std::string& ckpt_path) {
  if (!state_->optimizer) return absl::FailedPreconditionError("Load() before set_optimizer()");
  ASSIGN_OR_RETURN(CheckpointCommon common, ReadCheckpointCommon(ckpt_path));
  const int64_t step = common.step;
  const int64_t batch = common.global_batch;
  if (batch != stage_->topology.global_batch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", ckpt_path, " was written with global batch ", batch, "; this run has ",
        stage_->topology.global_batch(), " (it must not change across a resume)"));
  }
  std::vector<std::pair<size_t, LayerDict>> rolled;  // Note [Rolled rescue]
  for (size_t i = 0; i < stage_->layers.size(); ++i) {
    const std::string& name = stage_->layer_names[i];
    const bool roll = RolledLayer(ckpt_path, common.format, name);
    const std::string file = absl::StrCat(
        ckpt_path, "/", roll ? PendingLayerFileOf(name) : LayerFileOf(common.format, name));
    ASSIGN_OR_RETURN(auto in, ReadLayerFile(file, nullptr));
    RETURN_IF_ERROR(LoadLayer(i, in, file));
    if (roll) rolled.emplace_back(i, std::move(in));
  }
  if (!rolled.empty()) RETURN_IF_ERROR(RollLoadedForward(ckpt_path, common, rolled));
  state_->scaler.Restore(common.loss_scale, common.clean_steps);
  state_->iteration = step;
  state_->commit.Start(step);  // Note [Committed step] in varuna.cc: every rank loaded it
  MarkStateChanged(*state_, StageDevice(*stage_));
  LOG(INFO) << "rank=" << stage_->rank << " loaded " << ckpt_path << " (written by "
            << (common.pipelines.empty() ? absl::StrCat(common.stages, "x", common.replicas)
                                         : common.pipelines)
            << ", step " << step
            << (rolled.empty()
                    ? std::string()
                    : absl::StrCat("; ", rolled.size(), " layer(s) rolled forward from step ",
                                   step - 1, " with the update its rescuers recorded"))
            << ")";
  return step;
}

// Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc: the rolled layers hold step
// `common.step` - 1 and that step's gradients; the engine's own update, with the schedule of
// that step and the recorded norm, brings them to it. Only their parameters carry gradients
// during it (an optimizer steps every parameter that has one); the others' gradients, a
// data-parallel bucket's views among them, are put back after.
absl::Status Checkpointer::RollLoadedForward(
    const std::string& ckpt_path, const CheckpointCommon& common,
    const std::vector<std::pair<size_t, LayerDict>>& rolled) {
  const std::string& first = stage_->layer_names[rolled.front().first];
  if (!common.has_update) {
    return absl::FailedPreconditionError(absl::StrCat(
        ckpt_path, " holds layer ", first, " only as step ", common.step - 1, " with step ",
        common.step, "'s gradients, and no rescuer recorded that step's update"));
  }
  if (!apply_update_) return absl::InternalError("Load(): no update to roll layers forward with");
  state_->iteration = common.step - 1;                 // the update is the next step's: its rate
  if (common.update_skipped) return absl::OkStatus();  // an overflow: the step changed nothing
  return TorchCall(
      absl::StrCat("rolling ", first, " forward to step ", common.step), [&]() -> absl::Status {
        torch::NoGradGuard no_grad;
        // Each parameter once (a module shared by two layers would list it twice; a tied pair
        // is two tensors with one summed gradient, Note [Tied weights]).
        std::set<const void*> seen;
        std::vector<std::pair<torch::Tensor, torch::Tensor>> kept;  // (parameter, its gradient)
        for (const auto& l : stage_->layers) {
          for (auto& p : l->parameters(/*recurse=*/true)) {
            if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
            kept.emplace_back(p, p.grad());
            p.mutable_grad() = torch::Tensor();
          }
        }
        seen.clear();
        absl::Status st;
        std::vector<torch::Tensor> params;
        for (const auto& [i, in] : rolled) {
          for (auto& p : stage_->layers[i]->named_parameters(/*recurse=*/true)) {
            auto it = in.find("grad." + p.key());
            // Frozen when written (no update), or already given its gradient by a tied layer.
            if (it == in.end() || !seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
            torch::Tensor grad = it->value();
            // A rescue writes full tensors; with tensor parallelism now, this rank's slice (as
            // LoadLayer takes the parameter's).
            if (stage_->tp.enabled()) {
              auto shard = stage_->layer_shards[i].find(p.key());
              if (shard != stage_->layer_shards[i].end()) {
                grad = TakeShard(grad, shard->second, stage_->tp.size, stage_->tp.rank);
              }
            }
            if (!grad.sizes().equals(p.value().sizes())) {
              st = absl::DataLossError(absl::StrCat(ckpt_path, ": the gradient of ",
                                                    stage_->layer_names[i], "'s ", p.key(),
                                                    " has the wrong shape"));
              break;
            }
            p.value().mutable_grad() = grad.to(p.value().options());
            params.push_back(p.value());
          }
        }
        if (st.ok()) apply_update_(params, common.update_grad_norm);
        for (auto& [p, g] : kept) p.mutable_grad() = g;
        return st;
      });
}

}  // namespace varuna

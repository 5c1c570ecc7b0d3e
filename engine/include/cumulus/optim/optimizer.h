// Optimizers over FlatParameters, and the interface a new one implements.
//
// An update is one pass over the flat arrays (one launch per run of parameters sharing a group's
// setting on CUDA): the gradient is multiplied by UpdateScalars::grad_scale inside the pass (the
// Trainer folds the normalization 1/units, the clipping factor and the loss scale into it), then
// the rule is applied. The scalars live in the parameters' memory, so a CUDA update never waits
// for the host (Note [Device-side step] in kernels/optim_rules.h). State is a set of named flat
// arrays (StateSpec: f32 with one element per parameter element, or any dtype with one element per
// block, as the 8-bit state's codes and scales), allocated (zeros) at the first update in category
// optimizer_state; under ZeRO (keep_shard) they cover this rank's shard only. A frozen parameter
// (requires_grad false) is left bit-identical by every update, its state included, and resumes its
// own state when unfrozen (Note [Frozen parameters] in kernels/optim_rules.h).
//
// A new optimizer (tests/test_user_optimizer.cpp has Adagrad) declares its state and implements the
// update of one span:
//   class Adagrad final : public optim::Optimizer {
//    public:
//     Adagrad(std::shared_ptr<nn::FlatParameters> p, float lr) : Optimizer(std::move(p), lr) {}
//    protected:
//     std::vector<optim::StateSpec> state_specs() const override { return {{"sum"}}; }
//     void update(const optim::UpdateScalars* s, const optim::UpdateSpan& span) override {
//       // span.device's memory: on the CPU s is host memory, on CUDA a kernel reads it there.
//       float* w = span.values;
//       float* sum = state_array(0).data<float>() + span.state_offset; ...
//     }
//   };
// Checkpoints (state(), load_state()), memory predictions (state_to_allocate()) and the frozen
// parameters' bookkeeping come from the base class.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/nn/flat_parameters.h"
#include "cumulus/optim/update_scalars.h"

namespace cumulus::optim {

// A parameter group, as torch.optim's param_groups: the parameters it holds, by name (the
// FlatParameters slot names: Module::named_parameters()'s), its learning rate as a multiple of the
// optimizer's (scheduled) lr, as a PyTorch scheduler scales each group's own lr, and its weight
// decay. Parameters no group names keep the optimizer's lr and weight decay. See
// Optimizer::set_param_groups.
struct ParamGroup {
  std::vector<std::string> params;
  float lr_scale = 1.0f;       // >= 0; the group's lr = lr_scale x the optimizer's lr at each update
  float weight_decay = -1.0f;  // >= 0; < 0: the optimizer's (its options' weight_decay)
};

// The usual split (nanoGPT, Hugging Face's Trainer): parameters of two or more dimensions (the
// matrices of linear layers, convolution kernels, embeddings) decay by `weight_decay`, the others
// (biases, normalization scales and shifts) not at all. Two groups, in this order:
//   optimizer->set_param_groups(optim::decay_matrices_only(model.named_parameters(), 0.1f));
std::vector<ParamGroup> decay_matrices_only(const std::vector<std::pair<std::string, Tensor>>& named_parameters,
                                            float weight_decay);

// One state array of an optimizer: one element of `dtype` per `block` parameter elements (1, as
// most rules keep, up to FrozenChunks::kChunk, a divisor of it: per-block scales), over the
// elements the optimizer keeps (all, or its ZeRO shard). Zeros at the first update.
struct StateSpec {
  std::string name;
  DType dtype = DType::f32;
  int64_t block = 1;
};

// Where an optimizer keeps its state and runs its update (Optimizer::place_state).
enum class StatePlacement : uint8_t {
  device,  // beside the parameters, updated by the device's kernels
  host,    // in host memory (host_state_allocator()), updated by the CPU kernels
};
const char* state_placement_name(StatePlacement placement);  // "device", "host"

// The elements one call of Optimizer::update covers: a run of the flat arrays whose parameters
// share a group's setting (the whole array without groups).
struct UpdateSpan {
  int64_t offset = 0;        // first element, a multiple of FrozenChunks::kChunk
  int64_t state_offset = 0;  // its element in the state arrays: offset less the kept shard's start
  int64_t count = 0;
  // The span's values and gradients (element `offset` of the flat arrays) and the device whose
  // kernels update them: the parameters' own, or their host copies when the state is placed on the
  // host (Note [Optimizer state on the host] in engine/optim/optimizer.cpp).
  float* values = nullptr;
  const float* gradients = nullptr;
  Device device;
  float lr_scale = 1.0f;        // multiplies UpdateScalars::lr
  float weight_decay = -1.0f;   // the group's; < 0: the optimizer's own
  FrozenChunks frozen;          // from `offset` on: chunk 0 is the span's first
  float weight_decay_or(float own) const { return weight_decay >= 0.0f ? weight_decay : own; }
};

class Optimizer {
 public:
  Optimizer(std::shared_ptr<nn::FlatParameters> params, float lr);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // ---- a training loop's calls ----
  // One update of the optimizer's rule with the gradients as they are, at the optimizer's lr. Stale
  // slots count as zero gradient; frozen parameters are left alone. Does not mark gradients stale
  // (zero_grad() does). A training loop leaves this to train::Trainer, which normalizes, clips and
  // schedules first.
  void step();
  // The same with g_eff = grad_scale * gradient, at learning rate `lr`.
  void step(float grad_scale, float lr);
  void zero_grad() { params_->mark_gradients_stale(); }

  float lr() const { return lr_; }
  void set_lr(float lr);
  // Parameter groups (ParamGroup): per-group lr multiplier and weight decay, applied by every later
  // update (one UpdateSpan per run of consecutive parameters that share a setting). Every name must
  // be a parameter of these FlatParameters, in one group at most (InvalidArgument otherwise). An
  // empty list returns to one group. Frozen parameters stay untouched whatever their group. Groups
  // are configuration, not state: state() and load_state() are unchanged (a state saved with or
  // without groups loads either way), so a resumed run sets the same groups again. A Trainer's
  // captured step graph holds the settings it was captured with: set groups before the first step,
  // or call Trainer::reset() after changing them.
  void set_param_groups(const std::vector<ParamGroup>& groups);
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Updates applied so far (skipped steps excluded). On CUDA this reads the device: it waits for
  // the queued work (a host synchronization).
  int64_t updates() const;

  // ---- state, for checkpoints and memory plans ----
  // Bytes of optimizer state held now, as the allocators count them (0 before the first update),
  // wherever it is placed (with a state on the host, the copies of the weights and gradients its
  // update reads there included).
  int64_t state_bytes() const;
  // The state the next update will allocate on the parameters' device, one entry per tensor
  // (bytes requested): all of it before the first update, nothing once held or when placed on the
  // host. What a planner must add to the device's memory at rest, since every micro-batch after the
  // first step runs beside it (cumulus/plan/planner.h).
  std::vector<int64_t> state_to_allocate() const;
  // Whether the next update allocates state, wherever it is placed.
  bool next_update_allocates() const;
  // The state as named flat tensors (state_specs(), then "frozen_missed_updates", i32 per chunk,
  // once a parameter was frozen); empty before the first update. Under keep_shard the arrays are
  // the shard's (the missed counts stay whole): train::Trainer::optimizer_state() gathers them.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // One of state()'s tensors by name: undefined before the first update or for an unknown name.
  const Tensor& state_tensor(const std::string& name) const;
  // Every tensor a checkpoint of this optimizer holds, by name, dtype and shape (the whole arrays,
  // a shard kept or not), known before any is allocated: a checkpoint's optimizer tensors are
  // checked against it before one is read, so a forged shape cannot make a load allocate gigabytes.
  struct StateTensorInfo {
    std::string name;
    DType dtype;
    Shape shape;
  };
  std::vector<StateTensorInfo> state_layout() const;
  // Restores a state of state_layout()'s whole arrays (a checkpoint's; state() without a shard),
  // copying its kept shard's part into its own buffers (allocated if needed), and the number of
  // updates applied, so training resumes exactly. Throws on missing or mis-shaped tensors, naming them.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates);
  // Frees the state (its host copies and missed-update counts included) and sets the update count
  // to 0, as before the first update: for a probe that times an update on a fresh optimizer and
  // must leave it fresh (plan::plan_batch). The parameters are the caller's to restore.
  void discard_state();
  const nn::FlatParameters& parameters() const { return *params_; }
  nn::FlatParameters& parameters() { return *params_; }

  // ---- ZeRO: a rank's shard (train::Trainer with AccumulationOptions::zero_stage) ----
  // Keeps state for, and updates, only the elements [offset, offset + count) of the flat arrays
  // (this rank's dist::shard_layout shard: offset a multiple of FrozenChunks::kChunk, the end too
  // or the array's); the others' values arrive from the ranks that keep them. Before the first
  // update (InvalidArgument after). state() is then the shard's; state_layout() and load_state()
  // stay the whole arrays' (a checkpoint's), of which load_state() keeps the shard's part.
  void keep_shard(int64_t offset, int64_t count);
  int64_t shard_offset() const { return shard_offset_; }
  int64_t shard_count() const { return shard_count_ < 0 ? params_->size() : shard_count_; }

  // ---- optimizer state in host memory (ZeRO-Offload's idea) ----
  // Where the state lives and the update runs, before the first update (InvalidArgument after).
  // host: the state arrays are allocated in host_state_allocator()'s pool, which no device budget
  // counts, and the update runs there with the CPU kernels on copies of the kept shard's values and
  // gradients (values copied back; Note [Optimizer state on the host] in
  // engine/optim/optimizer.cpp), the same bits as the state on a CPU device. On a GPU the copies
  // cross the bus with one host synchronization, so a Trainer cannot replay its step as a graph.
  void place_state(StatePlacement placement);
  StatePlacement state_placement() const { return placement_; }

  // ---- 8-bit state (Note [8-bit optimizer state] in kernels/quantized_state.h) ----
  // The bits the state is kept in: 32, or 8 block-wise where the rule offers it (AdamW, SGD with
  // momentum). A change is allowed before the first update (InvalidArgument after, or for bits the
  // rule does not offer: the base class offers 32 only).
  virtual int state_bits() const { return 32; }
  virtual void set_state_bits(int bits);

  // ---- a driver's calls: an update decided on the device (train::Trainer) ----
  // Host work before an update: zeroes stale gradient slots and reads which parameters are frozen
  // (FlatParameters::refresh_frozen; the missed-update counts are allocated at the first freeze).
  // Never during a graph capture.
  void prepare_update();
  // The scalars the next update reads, in the parameters' memory: a driver's kernel writes them.
  UpdateScalars* update_scalars() const;
  // They as of now (on CUDA a host synchronization), and a queued write of all of them.
  UpdateScalars read_update_scalars() const;
  void write_update_scalars(const UpdateScalars& scalars);
  // Queues the update the scalars describe (nothing changes where they say skip): no host
  // synchronization. The first call allocates the state, so it must not be captured.
  void apply_update();

 protected:
  // ---- what an optimizer implements ----
  // Its state arrays (empty: none), fixed for the optimizer's lifetime.
  virtual std::vector<StateSpec> state_specs() const = 0;
  // One update of the elements [span.offset, span.offset + span.count) of parameters().values()
  // and parameters().gradients(), and from span.state_offset (span.state_offset / block for a
  // StateSpec's block) of the state arrays (state_array), by the rule with
  // g = scalars->grad_scale * gradient, lr = scalars->lr * span.lr_scale and the update count
  // scalars->updates (this update included), on span.values and span.gradients with span.device's
  // kernels. `scalars` is host memory when span.device is the CPU (the base class calls nothing
  // there when skip is set) and device memory on CUDA, where a kernel reads it and returns when skip
  // is set. Elements of a frozen chunk (span.frozen) must be left alone.
  virtual void update(const UpdateScalars* scalars, const UpdateSpan& span) = 0;
  // State array `index` of state_specs(), allocated before update() is called.
  Tensor& state_array(std::size_t index) { return state_[index]; }
  // InvalidArgument naming `caller` once the state exists: what only a fresh optimizer may change.
  void check_no_state_yet(const char* caller) const;

  std::shared_ptr<nn::FlatParameters> params_;

 private:
  // The missed-update counts as optimizer state (Note [Frozen parameters]).
  void restore_frozen_state(const std::vector<std::pair<std::string, Tensor>>& state);
  // The elements of a state array, held (the kept shard's) or whole (InvalidArgument for a block
  // that does not divide a chunk).
  int64_t numel_of(const StateSpec& spec, bool whole = false) const;
  // Copies elements [first, first + `shape`'s) of `name` (checked: `whole` elements of `dtype`)
  // into `into`, allocated as optimizer state when undefined; false when `state` has no `name`.
  bool copy_state_tensor(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name, DType dtype,
                         int64_t whole, int64_t first, const Shape& shape, Tensor& into) const;
  void allocate_state();
  // A state tensor of `placement_`'s memory, zeros when `zero`, in category optimizer_state.
  Tensor new_state_tensor(const Shape& shape, DType dtype, bool zero) const;
  void update_through_host();
  // The arrays an update reads: the flat values from element `values_first`, the gradients from
  // `gradients_first` (a shard's with sharded gradients), the frozen mask.
  struct UpdateArrays {
    float* values = nullptr;
    int64_t values_first = 0;
    const float* gradients = nullptr;
    int64_t gradients_first = 0;
    const uint8_t* frozen = nullptr;
    Device device;
  };
  // InvalidArgument unless the kept shard's gradients are in parameters().gradients().
  void check_gradients_held() const;
  // The spans of the update: one, or one per run of parameters sharing a group's setting.
  std::vector<UpdateSpan> spans(const UpdateArrays& arrays) const;

  float lr_;
  std::vector<ParamGroup> groups_;
  struct Segment {
    int64_t offset = 0, count = 0;
    float lr_scale = 1.0f;
    float weight_decay = -1.0f;
  };
  std::vector<Segment> segments_;  // empty without groups
  std::vector<Tensor> state_;      // by state_specs(); empty until the first update
  Tensor scalars_;                 // one UpdateScalars, category other
  Tensor missed_updates_;  // i32 per FlatParameters chunk, optimizer_state; undefined until a freeze
  int64_t shard_offset_ = 0, shard_count_ = -1;  // keep_shard's; -1: every element
  StatePlacement placement_ = StatePlacement::device;
  // Host placement: the copies of the kept shard's values and gradients in the host-state pool, and
  // the scalars and frozen mask read with them.
  struct HostCopies {
    Tensor values, gradients;
    UpdateScalars scalars;
    std::vector<uint8_t> frozen;
  };
  std::unique_ptr<HostCopies> host_;
};

}  // namespace cumulus::optim

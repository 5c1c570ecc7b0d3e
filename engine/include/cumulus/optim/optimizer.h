// Optimizers over FlatParameters. An update is one fused pass over the flat arrays (one launch on
// CUDA): the gradient is multiplied by a scale inside the pass (the Trainer folds the
// normalization 1/units and the clipping factor into it), then the rule is applied. State is
// allocated at the first update, in category optimizer_state. The step's scalars and counters
// (scale, lr, skip, the update count) live in a StepState in the parameters' memory, so a CUDA
// update never waits for the host (Note [Device-side step] in kernels/optim_rules.h). A frozen
// parameter (requires_grad false) is left bit-identical by every update, its state included, and
// resumes its own state when unfrozen (Note [Frozen parameters] in kernels/optim_rules.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/nn/flat_parameters.h"

namespace cumulus::kernels {
struct StepBuffers;
struct StepState;
struct FrozenChunks;
}  // namespace cumulus::kernels

namespace cumulus::optim {

class Accumulator;
struct OptimizerAccess;

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

class Optimizer {
 public:
  explicit Optimizer(std::shared_ptr<nn::FlatParameters> params, float lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of the optimizer's rule with the gradients as they are, at the optimizer's lr. Stale
  // slots count as zero gradient; frozen parameters are left alone. Does not mark gradients stale
  // (zero_grad() does). A training loop leaves this to optim::Trainer, which normalizes, clips and
  // schedules first.
  void step();
  void zero_grad() { params_->mark_gradients_stale(); }

  float lr() const { return lr_; }
  void set_lr(float lr);
  // Parameter groups (ParamGroup): per-group lr multiplier and weight decay, applied by every later
  // update (the same fused pass, one launch per run of consecutive parameters that share a
  // setting). Every name must be a parameter of these FlatParameters, in one group at most
  // (InvalidArgument otherwise). An empty list returns to one group. Frozen parameters stay
  // untouched whatever their group. Groups are configuration, not state: state() and load_state()
  // are unchanged (a state saved with or without groups loads either way), so a resumed run sets
  // the same groups again. A Trainer's captured step graph holds the settings it was captured with:
  // set groups before the first step, or call Trainer::reset() after changing them.
  void set_param_groups(const std::vector<ParamGroup>& groups);
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Updates applied so far (skipped steps excluded). On CUDA this reads the device: it waits for
  // the queued work (a host synchronization).
  int64_t updates() const;
  // Bytes of optimizer state held now, as the allocator counts them (0 before the first update).
  virtual int64_t state_bytes() const = 0;
  // The state the next update will allocate, one entry per tensor (bytes requested): all of it
  // before the first update, nothing once held. What a planner must add to the memory at rest,
  // since every micro-batch after the first step runs beside it (cumulus/plan/planner.h).
  virtual std::vector<int64_t> state_to_allocate() const = 0;
  // The state as named flat tensors (for checkpoints); empty before the first update.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  // Every tensor state() may ever hold, by name, dtype and shape, known before any is allocated:
  // a checkpoint's optimizer tensors are checked against it before one is read, so a forged shape
  // cannot make a load allocate gigabytes.
  struct StateTensorInfo {
    std::string name;
    DType dtype;
    Shape shape;
  };
  std::vector<StateTensorInfo> state_layout() const;
  // Restores what state() returned (copied into this optimizer's own buffers, allocated if needed)
  // and the number of updates applied, so training resumes exactly. Throws on missing or
  // mis-shaped tensors, naming them.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t updates) = 0;
  const nn::FlatParameters& parameters() const { return *params_; }
  nn::FlatParameters& parameters() { return *params_; }

 protected:
  // Queues the update described by the step state (kernels read it on CUDA; on the CPU, `host`
  // is that state).
  virtual void apply(const kernels::StepState& host) = 0;
  // The flat f32 state tensors (each the values' shape) the subclass keeps, by name.
  virtual std::vector<std::string> moment_names() const = 0;
  // Sets the update count (load_state).
  void set_updates(int64_t updates);
  // What the update kernels take for frozen parameters (null pointers until one was frozen).
  kernels::FrozenChunks frozen_chunks() const;
  // The missed-update counts as optimizer state: state() appends them ("frozen_missed_updates", i32,
  // once a parameter was frozen), load_state restores them (zeros when the checkpoint has none),
  // state_bytes() counts them.
  void append_frozen_state(std::vector<std::pair<std::string, Tensor>>& state) const;
  void restore_frozen_state(const std::vector<std::pair<std::string, Tensor>>& state);
  int64_t frozen_state_bytes() const;
  // Finds `name` in `state` and copies it into `into` (allocated in category optimizer_state
  // with the flat size when undefined).
  void restore_tensor(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name,
                      Tensor& into) const;
  // The one lookup both use: copies `name` (checked: `shape`'s elements of `dtype`) into `into`,
  // allocated as optimizer state when undefined; false when `state` has no `name`.
  bool copy_state_tensor(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& name,
                         DType dtype, const Shape& shape, Tensor& into) const;
  // A run of the flat arrays [offset, offset + count) whose parameters share a group's setting:
  // apply() updates each with lr x lr_scale and its weight decay (< 0: the optimizer's own).
  struct Segment {
    int64_t offset = 0, count = 0;
    float lr_scale = 1.0f;
    float weight_decay = -1.0f;
  };
  // Empty without groups (one pass over everything with the optimizer's settings).
  const std::vector<Segment>& segments() const { return segments_; }
  // The step state's device memory, which the update kernels read.
  kernels::StepBuffers* step_buffers() const;
  // `frozen` for the elements from `offset` on (a multiple of FrozenChunks::kChunk).
  static kernels::FrozenChunks offset_frozen(const kernels::FrozenChunks& frozen, int64_t offset);
  std::shared_ptr<nn::FlatParameters> params_;
  float lr_;
  std::vector<ParamGroup> groups_;
  std::vector<Segment> segments_;
  Tensor step_buffers_;  // one kernels::StepBuffers, category other
  Tensor missed_updates_;  // i32 per FlatParameters chunk, optimizer_state; undefined until a freeze

 private:
  // The step's plumbing: the runtime's Accumulator drives it, and the in-tree tests and benchmarks
  // reach it through engine/optim/optimizer_access.h. Not installed as an API.
  friend class Accumulator;
  friend struct OptimizerAccess;
  // One update with g_eff = grad_scale * gradient, at learning rate `lr`.
  void update(float grad_scale, float lr);
  // Reads which parameters are frozen now (FlatParameters::refresh_frozen) and, once one was, keeps
  // per-chunk counts of the updates they missed. Host work before an update's device part: update()
  // calls it, the Accumulator before every step (never during a graph capture).
  void prepare_frozen();
  // The update the step state already describes (the Accumulator's prepare_step wrote it; a
  // skipped step changes nothing). Queued only: no host synchronization.
  void apply_prepared_update();
  // The step state as of now (a host synchronization on CUDA).
  kernels::StepState read_step_state() const;
  // Writes `bytes` at `offset` of the step state (queued in order on CUDA, no synchronization).
  void write_step_state(std::size_t offset, const void* value, std::size_t bytes);
  // The f32 field at `offset` of the step state as a one-element tensor of `shape`, sharing its
  // memory: the Accumulator's loss scale, which backward reads as its seed (Note [Loss scaling]).
  Tensor step_state_scalar(std::size_t offset, const Shape& shape) const;
};

}  // namespace cumulus::optim

// Note [ZeRO stage 2]
// ZeRO-1 keeps 1/N of the optimizer state on each rank but still the whole gradient, 4 bytes a
// parameter. Stage 2 (Rajbhandari et al., 2020) keeps only the rank's shard of the reduced gradient
// (FlatParameters::shard_gradients: the same shard_layout part whose state and update the rank
// keeps). Under accumulation that means reducing every micro-batch's gradient across the ranks, as
// DeepSpeed's stage 2 does, not once a step: a rank's own sum over its micro-batches would need the
// whole gradient. So each backward is a round: a parameter's gradient is a view of its bucket's
// buffer (category gradients), made when the bucket's first gradient arrives (the hooks() of a
// BackwardHooksScope); once all the bucket's slots are final (LeafGradientDone) the buffer is
// reduce-scattered, this rank's part is added into the shard (written by the group's first round)
// and the buffer freed. Buckets are reduced in index order on every rank, as in data parallel.
//
// - Memory: the shard, size / N, plus the buckets a backward has open, about bucket_bytes each (a
//   parameter used early and late in the forward, a tied embedding, keeps its bucket open between).
// - Numbers: round k sums every rank's k-th micro-batch of the group, and the shard sums the rounds
//   in order, where data parallel sums each rank's micro-batches first, then the ranks: another
//   order, so stage 2 agrees with data parallel to float rounding, not bit for bit (Note [Data
//   parallel tolerance] in tests/test_dist.cpp), and its global norm is the sum of the ranks' shard
//   sums of squares (on CUDA summed on the device and all-reduced in place by NCCL before the step's
//   decision: Trainer::Parts::decide_sharded_step_cuda, not yet run on a GPU). The order is fixed
//   by the number of ranks: a rerun gives the same bits.
// - Data parallel in stage 2's order (AccumulationOptions::reduce_every_micro_batch, Keep::whole):
//   the same rounds and the same reduce-scatters, each followed by an all-gather of the bucket
//   (together an all-reduce's traffic), added whole, so every rank keeps the whole gradient; the
//   norm is each rank's shard's sum all-reduced, as in stage 2. Every sum is made by the same
//   collective with the same counts, so stages 0 and 1 then give stage 2's bits at any number of
//   ranks (tests/test_dist.cpp); a plain all-reduce would not (MPI orders its adds as it likes).
// - A short last group gives some ranks one micro-batch fewer: each of them reduces a round of
//   zeros at the step, so every rank makes the same reductions (x + 0 is x).
// - Slots a backward did not reach (frozen, unused) and the padding between slots are zeroed in the
//   buffer before its reduction, so the shard reads zeros there, as the flat gradient does.
// - The reductions block: a rank waits at each bucket for the others, which run the same backward
//   beside it. Traffic: a reduce-scatter is half an all-reduce's, once a micro-batch rather than
//   once a step.
#include "engine/dist/sharded_gradients.h"

#include <algorithm>

#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"
#include "engine/ops/internal.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus::dist {

namespace {
// Every rank's part of elements [offset, offset + count), from the bucket's first element.
std::vector<Shard> parts_of(const std::vector<Shard>& shards, int64_t offset, int64_t count) {
  std::vector<Shard> parts;
  for (const Shard& s : shards) {
    const int64_t lo = std::clamp(s.offset, offset, offset + count);
    const int64_t hi = std::clamp(s.offset + s.count, offset, offset + count);
    parts.push_back({lo - offset, hi - lo});
  }
  return parts;
}

void fill_zeros(float* data, int64_t n, Device device) {
  if (n <= 0) return;
  CUMULUS_DISPATCH(device, ctx, kernels::fill_cpu(data, 0.0f, n), kernels::fill_cuda(data, 0.0f, n, ctx.stream()));
}
}  // namespace

ShardedGradients::ShardedGradients(nn::FlatParameters& params, int64_t bucket_bytes, Communicator& communicator,
                                   const std::vector<Shard>& shards, Keep keep)
    : params_(params), communicator_(communicator), keep_(keep) {
  CUMULUS_CHECK(static_cast<int>(shards.size()) == communicator.world_size(), InvalidArgument,
                "ShardedGradients: ", shards.size(), " shards for ", communicator.world_size(), " ranks");
  const auto& slots = params.slots();
  bucket_of_slot_.assign(slots.size(), 0);
  for (const BucketRange& range : bucket_layout(params, bucket_bytes)) {
    Bucket b;
    static_cast<BucketRange&>(b) = range;
    b.slots_pending = static_cast<int>(b.end_slot - b.first_slot);
    b.parts = parts_of(shards, b.offset, b.count);
    for (std::size_t i = b.first_slot; i < b.end_slot; ++i) {
      bucket_of_slot_[i] = buckets_.size();
      slot_of_leaf_[impl_of(slots[i].param).get()] = i;
    }
    buckets_.push_back(std::move(b));
  }
  own_ = shards[static_cast<std::size_t>(communicator.rank())];
  if (keep == Keep::whole) params_.shard_gradients(0, params.size());  // the parameters' buffers released
  else params_.shard_gradients(own_.offset, own_.count);
}

ShardedGradients::~ShardedGradients() {
  for (Bucket& b : buckets_) release(b);
  if (keep_sharded_) return;
  try {
    params_.unshard_gradients();
  } catch (const OutOfMemory&) {
    // The parameters stay sharded (a valid state); a Trainer of another stage unshards them or says why.
  }
}

BackwardHooks ShardedGradients::hooks() {
  return {[this](const TensorImpl* leaf) { gradient_done(leaf); }, [this](TensorImpl& leaf) { give_buffer(leaf); },
          [this] { finish_backward(); }, [this] { abandon_backward(); }};
}

void ShardedGradients::give_buffer(TensorImpl& leaf) {
  const auto it = slot_of_leaf_.find(&leaf);
  if (it == slot_of_leaf_.end()) return ops::detail::allocate_grad_buffer(leaf);  // not a parameter
  Bucket& b = buckets_[bucket_of_slot_[it->second]];
  CUMULUS_CHECK(!b.buffer.defined(), Error, "ShardedGradients: a bucket's buffer exists but a slot has none");
  {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    b.buffer = Tensor::empty(Shape{b.count}, DType::f32, params_.device());
  }
  for (std::size_t i = b.first_slot; i < b.end_slot; ++i) {
    const nn::FlatParameters::Slot& s = params_.slots()[i];
    impl_of(s.param)->autograd.grad = b.buffer.narrow_rows(s.offset - b.offset, s.numel).reshape(s.param.shape());
    s.param.mark_grad_stale(StaleReason::sharded);
  }
}

void ShardedGradients::gradient_done(const void* leaf) {
  const auto it = slot_of_leaf_.find(leaf);
  if (it == slot_of_leaf_.end()) return;
  --buckets_[bucket_of_slot_[it->second]].slots_pending;
  while (next_ < buckets_.size() && buckets_[next_].slots_pending == 0) {
    reduce(buckets_[next_++]);
    ++reduced_in_backward_;
  }
}

void ShardedGradients::finish_backward() {
  while (next_ < buckets_.size()) reduce(buckets_[next_++]);
  end_round();
}

void ShardedGradients::abandon_backward() {
  for (Bucket& b : buckets_) {
    release(b);
    b.slots_pending = static_cast<int>(b.end_slot - b.first_slot);
  }
  next_ = 0;
}

void ShardedGradients::reduce_zeros() {
  for (Bucket& b : buckets_) reduce(b);  // no buffer: a bucket of zeros
  end_round();
}

void ShardedGradients::end_round() {
  for (Bucket& b : buckets_) b.slots_pending = static_cast<int>(b.end_slot - b.first_slot);
  next_ = 0;
  ++rounds_;
}

int64_t ShardedGradients::round_bytes() const {
  int64_t elements = 0;
  for (const Bucket& b : buckets_) elements += b.count;
  return elements * static_cast<int64_t>(sizeof(float));
}

// The bucket's sum across ranks, this rank's part into the shard (Note [ZeRO stage 2]).
void ShardedGradients::reduce(Bucket& b) {
  const Device device = params_.device();
  if (b.buffer.defined()) {
    zero_unwritten(b);
  } else {
    MemoryCategoryScope scope(MemoryCategory::gradients);
    b.buffer = Tensor::zeros(Shape{b.count}, DType::f32, device);
  }
  float* sums = b.buffer.data<float>();
  communicator_.reduce_scatter_sum(sums, b.parts, device);
  if (keep_ == Keep::whole) communicator_.all_gather(sums, b.parts, device);
  const Shard kept = keep_ == Keep::whole ? Shard{0, b.count} : b.parts[static_cast<std::size_t>(communicator_.rank())];
  if (kept.count > 0) {
    float* into = params_.gradients().data<float>() + (b.offset + kept.offset - params_.gradients_offset());
    const float* from = sums + kept.offset;
    // The group's first round writes (the shard may hold a skipped step's non-finite values).
    if (rounds_ == 0) copy_bytes(into, device, from, device, static_cast<std::size_t>(kept.count) * sizeof(float));
    else
      CUMULUS_DISPATCH(device, ctx, kernels::accumulate_cpu(from, 1.0f, into, kept.count),
                       kernels::accumulate_cuda(from, 1.0f, into, kept.count, ctx.stream()));
  }
  release(b);
}

// Zeros where the backward wrote nothing: slots it did not reach, and the padding after each slot.
void ShardedGradients::zero_unwritten(Bucket& b) const {
  float* data = b.buffer.data<float>();
  const Device device = params_.device();
  for (std::size_t i = b.first_slot; i < b.end_slot; ++i) {
    const nn::FlatParameters::Slot& s = params_.slots()[i];
    const int64_t begin = s.offset - b.offset, written_end = begin + s.numel;
    const int64_t slot_end = i + 1 < b.end_slot ? params_.slots()[i + 1].offset - b.offset : b.count;
    if (s.param.grad_stale()) fill_zeros(data + begin, s.numel, device);
    fill_zeros(data + written_end, slot_end - written_end, device);
  }
}

void ShardedGradients::release(Bucket& b) {
  if (!b.buffer.defined()) return;
  for (std::size_t i = b.first_slot; i < b.end_slot; ++i) {
    const nn::FlatParameters::Slot& s = params_.slots()[i];
    impl_of(s.param)->autograd.grad = Tensor();
    s.param.mark_grad_stale(StaleReason::sharded);
  }
  b.buffer = Tensor();
}

}  // namespace cumulus::dist

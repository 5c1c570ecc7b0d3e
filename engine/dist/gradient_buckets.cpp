#include "engine/dist/gradient_buckets.h"

#include "cumulus/core/error.h"
#include "engine/tensor/tensor_impl.h"

namespace cumulus::dist {

std::vector<BucketRange> bucket_layout(const nn::FlatParameters& params, int64_t bucket_bytes) {
  CUMULUS_CHECK(bucket_bytes > 0, InvalidArgument, "Trainer: bucket_bytes must be > 0");
  const auto& slots = params.slots();
  std::vector<BucketRange> out;
  // Reverse slot order: backward finishes the last layers first.
  for (std::size_t end = slots.size(); end > 0;) {
    BucketRange b;
    b.end_slot = end;
    int64_t bytes = 0;
    std::size_t first = end;
    while (first > 0 && (bytes == 0 || bytes + slots[first - 1].numel * 4 <= bucket_bytes)) {
      --first;
      bytes += slots[first].numel * 4;
    }
    b.first_slot = first;
    b.offset = slots[first].offset;
    b.count = slots[end - 1].offset + slots[end - 1].numel - b.offset;
    out.push_back(b);
    end = first;
  }
  return out;
}

GradientBuckets::GradientBuckets(const nn::FlatParameters& params, int64_t bucket_bytes, Communicator& communicator)
    : params_(params), communicator_(communicator) {
  bucket_of_slot_.assign(params.slots().size(), 0);
  for (const BucketRange& range : bucket_layout(params, bucket_bytes)) {
    Bucket b;
    static_cast<BucketRange&>(b) = range;
    b.slots_pending = static_cast<int>(b.end_slot - b.first_slot);
    for (std::size_t i = b.first_slot; i < b.end_slot; ++i) {
      bucket_of_slot_[i] = buckets_.size();
      slot_of_leaf_[impl_of(params.slots()[i].param).get()] = i;
    }
    buckets_.push_back(b);
  }
}

void GradientBuckets::start(std::size_t index) {
  const Bucket& b = buckets_[index];
  float* grad = static_cast<float*>(params_.gradients().raw_data()) + b.offset;
  communicator_.start_all_reduce_sum(grad, b.count, Element::f32, params_.device());
}

void GradientBuckets::gradient_done(const void* leaf) {
  auto it = slot_of_leaf_.find(leaf);
  if (it == slot_of_leaf_.end()) return;
  --buckets_[bucket_of_slot_[it->second]].slots_pending;
  while (next_ < buckets_.size() && buckets_[next_].slots_pending == 0) {
    start(next_++);
    ++started_in_backward_;
  }
  communicator_.progress();
}

void GradientBuckets::start_rest() {
  while (next_ < buckets_.size()) start(next_++);
}

int64_t GradientBuckets::bytes() const {
  int64_t elements = 0;
  for (const Bucket& b : buckets_) elements += b.count;
  return elements * static_cast<int64_t>(sizeof(float));
}

void GradientBuckets::rearm() {
  for (Bucket& b : buckets_) b.slots_pending = static_cast<int>(b.end_slot - b.first_slot);
  next_ = 0;
}

}  // namespace cumulus::dist

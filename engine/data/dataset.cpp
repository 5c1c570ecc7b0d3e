// TensorDataset, and the DataLoader that gathers batches of any dataset's tensors (the image path
// is one use: u8 pixels converted to pixel / 255 on the way).
//
// Note [Shuffle order]: the permutation for (seed, epoch) is a Fisher-Yates shuffle on the host
// driven by Generator(seed) at counter offset epoch * 2^32, so it depends on nothing else (not
// the device, not the epochs drawn before: resuming at epoch e gives the same order). It is
// uploaded once per epoch as i32 indices; each batch is then one gather kernel on the device.
#include "cumulus/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "cumulus/core/error.h"
#include "cumulus/memory/category.h"
#include "cumulus/tensor/random.h"
#include "engine/ops/internal.h"

#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace cumulus::data {

namespace {

// 24 uniformly random bits from one Generator draw: fill_uniform yields k / 2^24 exactly.
uint64_t draw_24_bits(Generator& gen) {
  float u = 0.0f;
  gen.fill_uniform(&u, 1, 0.0f, 1.0f);
  return static_cast<uint64_t>(u * 16777216.0f);
}

// Uniform in [0, bound), bound <= 2^48, by rejection (no modulo bias).
uint64_t draw_below(Generator& gen, uint64_t bound) {
  constexpr uint64_t kRange = uint64_t(1) << 48;
  const uint64_t limit = kRange - kRange % bound;
  for (;;) {
    const uint64_t r = (draw_24_bits(gen) << 24) | draw_24_bits(gen);
    if (r < limit) return r % bound;
  }
}

}  // namespace

// ---- TensorDataset ---------------------------------------------------------------------------

namespace {

// Elements of one sample: the product of the trailing dimensions.
int64_t row_elements(const Tensor& t) {
  int64_t n = 1;
  for (int d = 1; d < t.ndim(); ++d) n *= t.shape()[d];
  return n;
}

int64_t row_bytes(const Tensor& t) { return row_elements(t) * static_cast<int64_t>(dtype_size(t.dtype())); }

bool dataset_dtype(DType d) { return d == DType::f32 || d == DType::i32 || d == DType::i64 || d == DType::u8; }

}  // namespace

TensorDataset::TensorDataset(std::vector<Tensor> tensors, std::vector<std::string> names)
    : tensors_(std::move(tensors)), names_(std::move(names)), divisors_(tensors_.size(), 0.0f) {
  CUMULUS_CHECK(names_.empty() || names_.size() == tensors_.size(), InvalidArgument, "TensorDataset: ", names_.size(),
                " names for ", tensors_.size(), " tensors");
  for (std::size_t k = 0; k < tensors_.size(); ++k) {
    const Tensor& t = tensors_[k];
    CUMULUS_CHECK(t.defined(), InvalidArgument, "TensorDataset: ", describe(k), " is undefined");
    CUMULUS_CHECK(dataset_dtype(t.dtype()), InvalidArgument, "TensorDataset: ", describe(k), " is ",
                  dtype_name(t.dtype()), "; a dataset holds f32, i32, i64 or u8 tensors");
    CUMULUS_CHECK(t.ndim() >= 1, InvalidArgument, "TensorDataset: ", describe(k),
                  " is 0-d; every tensor's first dimension is its samples");
    const Tensor& first = tensors_[0];
    CUMULUS_CHECK(t.size(0) == first.size(0), ShapeError, "TensorDataset: ", describe(k), " has ", t.size(0),
                  " samples (shape ", t.shape().str(), ") but ", describe(0), " has ", first.size(0), " (shape ",
                  first.shape().str(), "); every tensor's first dimension is its samples");
    CUMULUS_CHECK(t.device() == first.device(), DeviceError, "TensorDataset: ", describe(k), " is on ",
                  t.device().str(), " but ", describe(0), " on ", first.device().str());
  }
}

TensorDataset& TensorDataset::to_float(std::size_t k, float divisor) {
  (void)tensor(k);  // checks k
  CUMULUS_CHECK(std::isfinite(divisor) && divisor != 0.0f, InvalidArgument, "TensorDataset::to_float: ", describe(k),
                ": the divisor must be finite and non-zero, got ", divisor);
  divisors_[k] = divisor;
  return *this;
}

TensorDataset TensorDataset::slice(int64_t begin, int64_t count) const {
  CUMULUS_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), InvalidArgument, "TensorDataset::slice: samples [",
                begin, ", ", begin + count, ") of a dataset of ", size());
  TensorDataset part = *this;
  for (Tensor& t : part.tensors_) t = t.narrow_rows(begin, count);
  return part;
}

TensorDataset& TensorDataset::set_units_per_row(int64_t units) {
  CUMULUS_CHECK(units >= 1, InvalidArgument, "TensorDataset::set_units_per_row: ", units,
                " units per row; a row holds at least one (1: a row is a sample)");
  units_per_row_ = units;
  return *this;
}

const Tensor& TensorDataset::tensor(std::size_t k) const {
  CUMULUS_CHECK(k < tensors_.size(), InvalidArgument, "TensorDataset: no tensor ", k, " in a dataset of ",
                tensors_.size());
  return tensors_[k];
}

std::string TensorDataset::describe(std::size_t k) const {
  std::string s = "tensor " + std::to_string(k);
  if (k < names_.size()) s += " ('" + names_[k] + "')";
  return s;
}

bool TensorDataset::floating(std::size_t k) const { return divisors_[k] != 0.0f || tensor(k).dtype() == DType::f32; }
float TensorDataset::divisor(std::size_t k) const { return divisors_[k] != 0.0f ? divisors_[k] : 1.0f; }

// ---- DataLoader ------------------------------------------------------------------------------

namespace {

static_assert(DataLoader::kMaxTensors == static_cast<std::size_t>(kernels::kMaxGatherColumns));

// The gather's columns: the dataset's tensors, read at `src` (the tensors themselves, or a staging
// ring or upload of their rows), into the batch's tensors.
kernels::GatherColumns gather_columns(const TensorDataset& ds, const std::vector<const void*>& src,
                                      const Batch& batch) {
  kernels::GatherColumns columns{};
  columns.count = static_cast<int32_t>(ds.num_tensors());
  for (std::size_t k = 0; k < ds.num_tensors(); ++k) {
    const Tensor& t = ds.tensor(k);
    kernels::GatherColumn& c = columns.column[k];
    c.src = src[k];
    c.dst = batch.tensors[k].raw_data();
    c.row = row_elements(t);
    c.src_type = t.dtype();
    c.dst_type = batch.tensors[k].dtype();  // the loader's dtype for a floating tensor, else t's
    c.divisor = ds.divisor(k);
  }
  return columns;
}

}  // namespace

// Note [Host-resident data]
// A dataset kept on the host (a CPU dataset, batches made on a CUDA device) costs the device only a
// ring of two staging slots of batch_size samples of every tensor (their bytes as they are: u8
// pixels stay u8, category data). stage(i, then), called by the host before each gather, (1)
// marks the slot the previous gather read as free (an event on the compute stream, recorded after
// that gather was queued); (2) makes sure batch i is in its slot (normally copied ahead by the
// previous stage); (3) makes the compute stream wait for that copy; (4) starts batch `then` into
// the other slot: the host gathers its rows of every tensor (in the epoch's order) into a pinned
// buffer and a copy stream moves them to the device once the gather that last read that slot is
// done. The copy of batch i + 1 thus runs while batch i computes. The device gather (the same
// kernel as for device-resident data, so captured CUDA graphs stay valid) reads the slot from the
// cursor's ring_slot, which stage() writes on the compute stream (a one-thread launch): the host
// alone counts slots, so an exception between a stage() and its gather cannot set the two apart,
// and a graph replayed after stage(i) reads batch i. The only host wait is for a pinned buffer's
// previous copy before it is refilled (two batches back: normally long finished, and then not
// counted as a host synchronization). On the CPU the option means nothing: the data is already
// where the batches are made.
//
// The device ring comes from the caching allocator, which hands out a block freed on the compute
// stream at once (Note [Caching allocator]): kernels queued before, the planner's probes for one,
// may still be using that memory when the ring is made. The copy stream is not ordered after them
// by the allocator, so each slot starts out consumed at the ring's allocation (its event recorded
// on the compute stream there): the first fill of a slot waits for that work like every later one.
// An event never recorded would not order anything: waiting for it is no wait at all.
struct DataLoader::HostStaging {
#if CUMULUS_WITH_CUDA
  static constexpr int kSlots = 2;
  int64_t batch = 0;                // samples per slot
  std::vector<int64_t> row;         // per tensor: bytes of one sample
  std::vector<std::size_t> offset;  // per tensor: where its rows start in a pinned slot (8-aligned)
  std::size_t slot_bytes = 0;       // one pinned slot, every tensor's rows
  std::vector<Tensor> rings;        // per tensor, on the device: [kSlots * batch, row] u8 (category data)
  uint8_t* pinned = nullptr;        // host ring: kSlots slots of slot_bytes
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t copied[kSlots] = {};    // the slot's copy to the device is done (copy stream)
  cudaEvent_t consumed[kSlots] = {};  // the gather that read the slot is done (compute stream)
  int64_t holds[kSlots] = {-1, -1};   // the batch each slot holds or is receiving (-1: none)
  uint64_t holds_epoch[kSlots] = {0, 0};
  uint64_t epoch_serial = 1;  // changes with every set_epoch(): a slot filled in another epoch is stale
  int next_slot = 0;          // the slot the next gather reads (the device cursor's ring_slot)
  int pending_consumed = -1;  // the slot of the last staged gather, not yet marked consumed
  int64_t staged = -1;        // the batch stage() made ready for the next gather (-1: none)

  HostStaging(int device_index, int64_t batch_size, std::vector<int64_t> row_bytes)
      : batch(batch_size), row(std::move(row_bytes)) {
    cuda::DeviceGuard guard(device_index);
    const Device device = Device::cuda(device_index);
    for (const int64_t r : row) {
      offset.push_back(slot_bytes);
      slot_bytes += static_cast<std::size_t>((batch * r + 7) / 8 * 8);
    }
    {
      MemoryCategoryScope scope(MemoryCategory::data);
      OpScope op("host data staging");
      for (const int64_t r : row) rings.push_back(Tensor::empty(Shape{kSlots * batch, r}, DType::u8, device));
    }
    CUMULUS_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kSlots * std::max<std::size_t>(slot_bytes, 8),
                                     cudaHostAllocDefault));
    CUMULUS_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
    for (int k = 0; k < kSlots; ++k) {
      CUMULUS_CUDA_CHECK(cudaEventCreateWithFlags(&copied[k], cudaEventDisableTiming));
      CUMULUS_CUDA_CHECK(cudaEventCreateWithFlags(&consumed[k], cudaEventDisableTiming));
      // The ring's first fill waits for this: the work queued before the ring's allocation.
      CUMULUS_CUDA_CHECK(cudaEventRecord(consumed[k], cuda::stream(device_index)));
    }
  }

  ~HostStaging() {
    // The copies may still run: wait for them before the buffers go (the device ring returns to
    // the caching allocator, which reuses it on the compute stream only).
    if (copy_stream) CUMULUS_CUDA_WARN(cudaStreamSynchronize(copy_stream));
    for (int k = 0; k < kSlots; ++k) {
      if (copied[k]) CUMULUS_CUDA_WARN(cudaEventDestroy(copied[k]));
      if (consumed[k]) CUMULUS_CUDA_WARN(cudaEventDestroy(consumed[k]));
    }
    if (copy_stream) CUMULUS_CUDA_WARN(cudaStreamDestroy(copy_stream));
    if (pinned) CUMULUS_CUDA_WARN(cudaFreeHost(pinned));
  }

  // Tensor t's rows in slot k: on the host (pinned) and on the device (its ring).
  uint8_t* host_rows(int k, std::size_t t) const { return pinned + k * slot_bytes + offset[t]; }
  uint8_t* device_rows(int k, std::size_t t) const { return rings[t].data<uint8_t>() + k * batch * row[t]; }

  // Blocks until `e` has completed; counted as a host synchronization only if it had not.
  static void wait_if_pending(cudaEvent_t e) {
    const cudaError_t st = cudaEventQuery(e);
    if (st == cudaSuccess) return;
    if (st != cudaErrorNotReady) CUMULUS_CUDA_CHECK(st);
    cuda::wait_event(e);
  }
#endif
};

DataLoader::DataLoader(const TensorDataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed)
    : DataLoader(dataset, batch_size, shuffle, seed, dataset.device()) {}

DataLoader::DataLoader(const TensorDataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed, Device device)
    : dataset_(dataset), batch_size_(batch_size), shuffle_(shuffle), seed_(seed), device_(device) {
  CUMULUS_CHECK(batch_size > 0, InvalidArgument, "DataLoader: batch_size must be positive, got ", batch_size);
  CUMULUS_CHECK(dataset.num_tensors() > 0, InvalidArgument, "DataLoader: the dataset has no tensors");
  CUMULUS_CHECK(dataset.num_tensors() <= kMaxTensors, InvalidArgument, "DataLoader: the dataset has ",
                dataset.num_tensors(), " tensors; a loader gathers at most ", kMaxTensors);
  CUMULUS_CHECK(dataset.size() <= std::numeric_limits<int32_t>::max(), InvalidArgument,
                "DataLoader: ", dataset.size(), " samples exceed i32 indices");
  const Device held_on = dataset.device();
  CUMULUS_CHECK(held_on == device || (held_on.is_cpu() && device.is_cuda()), DeviceError,
                "DataLoader: batches on ", device.str(), " from a dataset on ", held_on.str(),
                " (a dataset is used on its own device, or kept on the host for a CUDA device)");
  if (held_on != device) {
    check_device_available(device);
#if CUMULUS_WITH_CUDA
    std::vector<int64_t> rows;
    for (std::size_t t = 0; t < dataset.num_tensors(); ++t) rows.push_back(row_bytes(dataset.tensor(t)));
    staging_ = std::make_unique<HostStaging>(device.index(), std::min(batch_size, std::max<int64_t>(dataset.size(), 1)),
                                             std::move(rows));
#endif
  }
  set_epoch(0);
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

void DataLoader::set_epoch(int epoch) {
  if (cursor_.defined()) seek(0);
  else position_ = 0;
#if CUMULUS_WITH_CUDA
  if (staging_) ++staging_->epoch_serial;
#endif
  if (!shuffle_) return;
  const int64_t n = dataset_.size();
  std::vector<int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Generator gen(seed_);
  gen.set_state(seed_, static_cast<uint64_t>(static_cast<uint32_t>(epoch)) << 32);  // Note [Shuffle order]
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(draw_below(gen, static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  if (staging_) {  // the host gathers: the order stays on the host
    host_order_ = std::move(order);
    return;
  }
  MemoryCategoryScope scope(MemoryCategory::data);
  Tensor fresh = Tensor::from_vector(order, Shape{n}, device_);
  // Into the same buffer every epoch: a captured gather holds its address.
  if (order_.defined()) order_.copy_from(fresh);
  else order_ = std::move(fresh);
}

void DataLoader::seek(int64_t i) {
  CUMULUS_CHECK(i >= 0 && i <= num_batches(), InvalidArgument, "DataLoader::seek(", i, "): the epoch has ",
                num_batches(), " batches");
  position_ = i;
  if (device_.is_cpu()) return;  // the host's position is the cursor: no graph replays a CPU gather
  if (!cursor_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::data);
    cursor_ = Tensor::zeros(Shape{4}, DType::i32, device_);  // kernels::GatherCursor, 16 bytes
  }
  [[maybe_unused]] auto* cursor = static_cast<kernels::GatherCursor*>(cursor_.raw_data());
  CUMULUS_DISPATCH(device_, ctx, (void)0, kernels::set_gather_cursor_cuda(cursor, i, -1, ctx.stream()));
}

void DataLoader::copy_rows_on_host(std::size_t k, int64_t i, int64_t count, uint8_t* out) const {
  const Tensor& src = dataset_.tensor(k);
  const int64_t row = row_bytes(src);
  if (row == 0) return;
  const auto* rows = static_cast<const uint8_t*>(src.raw_data());
  for (int64_t r = 0; r < count; ++r) {
    const int64_t j = i * batch_size_ + r;
    const int64_t s = shuffle_ ? static_cast<int64_t>(host_order_[static_cast<std::size_t>(j)]) : j;
    std::memcpy(out + r * row, rows + s * row, static_cast<std::size_t>(row));
  }
}

void DataLoader::stage(int64_t i, int64_t then) {
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::stage(", i, "): the epoch has ",
                num_batches(), " batches");
  if (!staging_) return;
#if CUMULUS_WITH_CUDA
  if (!cursor_.defined()) seek(i);
  HostStaging& st = *staging_;
  cuda::DeviceGuard guard(device_.index());
  cuda::Context& ctx = cuda::context(device_.index());
  CUMULUS_CHECK(!ctx.capturing(), InvalidArgument,
                "DataLoader: host-resident data cannot be staged inside a CUDA graph capture; stage batch ", i,
                " before the captured micro-batch (DataLoaderAccess::stage)");
  // Starts the copy of batch b into slot k: once the gather that last read the slot is done, and
  // once the pinned half of the slot has been copied out (two batches back).
  auto fill = [&](int k, int64_t b) {
    HostStaging::wait_if_pending(st.copied[k]);
    const int64_t count = std::min(batch_size_, dataset_.size() - b * batch_size_);
    for (std::size_t t = 0; t < dataset_.num_tensors(); ++t) copy_rows_on_host(t, b, count, st.host_rows(k, t));
    CUMULUS_CUDA_CHECK(cudaStreamWaitEvent(st.copy_stream, st.consumed[k], 0));
    for (std::size_t t = 0; t < dataset_.num_tensors(); ++t)
      CUMULUS_CUDA_CHECK(cudaMemcpyAsync(st.device_rows(k, t), st.host_rows(k, t),
                                         static_cast<std::size_t>(count * st.row[t]), cudaMemcpyHostToDevice,
                                         st.copy_stream));
    CUMULUS_CUDA_CHECK(cudaEventRecord(st.copied[k], st.copy_stream));
    st.holds[k] = b;
    st.holds_epoch[k] = st.epoch_serial;
  };
  // (1) The previous gather has been queued: its slot is free once the compute stream passes here.
  if (st.pending_consumed >= 0) CUMULUS_CUDA_CHECK(cudaEventRecord(st.consumed[st.pending_consumed], ctx.stream()));
  // (2) Batch i into the slot the next gather reads, unless it was copied ahead.
  const int k = st.next_slot;
  if (st.holds[k] != i || st.holds_epoch[k] != st.epoch_serial) fill(k, i);
  // (3) The gather waits for the copy.
  CUMULUS_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), st.copied[k], 0));
  // (4) The next gather reads slot k: the host says so, so no failure between here and the gather
  // can set the device's slot apart from the host's.
  kernels::set_gather_cursor_cuda(static_cast<kernels::GatherCursor*>(cursor_.raw_data()), -1, k, ctx.stream());
  st.pending_consumed = k;
  st.next_slot = (k + 1) % HostStaging::kSlots;
  st.staged = i;
  // (5) Batch `then` into the other slot, behind this one's compute.
  if (then >= 0 && then < num_batches()) fill(st.next_slot, then);
#else
  (void)then;
#endif
}

Batch DataLoader::next(int64_t i) {
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::next(", i, "): the epoch has ",
                num_batches(), " batches");
  position_ = i;
  if (device_.is_cpu()) {
    Batch b = gather_on_cpu(i);
    ++position_;
    return b;
  }
  if (!cursor_.defined()) seek(i);
  // The gather reads the dataset's tensors in the epoch's order, or the staging ring's slot.
  [[maybe_unused]] int64_t ring = 0, stride = batch_size_;
  [[maybe_unused]] const int32_t* order = nullptr;
  std::vector<const void*> src(dataset_.num_tensors());
#if CUMULUS_WITH_CUDA
  if (staging_) {
    if (staging_->staged != i) stage(i, i + 1);
    staging_->staged = -1;
    ring = HostStaging::kSlots;
    stride = staging_->batch;
    for (std::size_t t = 0; t < src.size(); ++t) src[t] = staging_->rings[t].raw_data();
  } else {
    for (std::size_t t = 0; t < src.size(); ++t) src[t] = dataset_.tensor(t).raw_data();
    order = shuffle_ ? order_.data<int32_t>() : nullptr;
  }
#endif
  Batch b = empty_batch(i);
  [[maybe_unused]] const kernels::GatherColumns columns = gather_columns(dataset_, src, b);
  [[maybe_unused]] const int64_t count = b.tensors[0].size(0);
  CUMULUS_DISPATCH(
      device_, ctx, (void)0,
      kernels::gather_rows_at_cursor_cuda(columns, order, static_cast<kernels::GatherCursor*>(cursor_.raw_data()),
                                          stride, ring, count, ctx.stream()));
  ++position_;
  return b;
}

DataLoader& DataLoader::set_dtype(DType dtype) {
  CUMULUS_CHECK(is_floating(dtype), InvalidArgument, "DataLoader::set_dtype: batches are f32, bf16 or f16, not ",
                dtype_name(dtype));
  dtype_ = dtype;
  return *this;
}

int64_t DataLoader::rows(int64_t i) const { return std::min(batch_size_, dataset_.size() - i * batch_size_); }

Batch DataLoader::empty_batch(int64_t i) const {
  const int64_t count = rows(i);
  MemoryCategoryScope scope(MemoryCategory::data);
  OpScope op("gather batch");  // an out-of-memory report names the batch, not "(no op)"
  Batch b;
  for (std::size_t k = 0; k < dataset_.num_tensors(); ++k) {
    const Tensor& t = dataset_.tensor(k);
    Shape shape{count};
    for (int d = 1; d < t.ndim(); ++d) shape.push_back(t.shape()[d]);
    b.tensors.push_back(Tensor::empty(shape, dataset_.floating(k) ? dtype_ : t.dtype(), device_));
  }
  b.x = b.tensors[0];
  if (b.tensors.size() > 1) b.y = b.tensors[1];
  b.units = units(i);
  return b;
}

// Ceiling division without n + b - 1, which overflows for a batch size near INT64_MAX.
int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_.size();
  return n / batch_size_ + (n % batch_size_ != 0 ? 1 : 0);
}

Batch DataLoader::gather_on_cpu(int64_t i) const {
  Batch b = empty_batch(i);
  std::vector<const void*> src(dataset_.num_tensors());
  for (std::size_t t = 0; t < src.size(); ++t) src[t] = dataset_.tensor(t).raw_data();
  const int32_t* order = shuffle_ ? order_.data<int32_t>() : nullptr;
  kernels::gather_rows_cpu(gather_columns(dataset_, src, b), order, i * batch_size_, b.tensors[0].size(0));
  return b;
}

}  // namespace cumulus::data

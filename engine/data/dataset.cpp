// MNIST-format splits loaded once (onto the device, or kept on the host), and the DataLoader that
// gathers batches.
//
// Note [Shuffle order]: the permutation for (seed, epoch) is a Fisher-Yates shuffle on the host
// driven by Generator(seed) at counter offset epoch * 2^32, so it depends on nothing else (not
// the device, not the epochs drawn before: resuming at epoch e gives the same order). It is
// uploaded once per epoch as i32 indices; each batch is then one gather kernel on the device.
#include "cumulus/data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "cumulus/core/error.h"
#include "cumulus/data/idx.h"
#include "cumulus/memory/category.h"
#include "cumulus/tensor/random.h"
#include "engine/ops/internal.h"

#if CUMULUS_WITH_CUDA
#include "cumulus/core/cuda_check.h"
#include "cumulus/core/cuda_context.h"
#endif

namespace cumulus::data {

namespace {

constexpr int64_t kRows = 28, kCols = 28, kClasses = 10;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// dir/NAME.gz if present, else dir/NAME.
std::string find_split_file(const std::string& dir, const std::string& name) {
  const std::string base = (dir.empty() || dir.back() == '/') ? dir + name : dir + "/" + name;
  if (file_exists(base + ".gz")) return base + ".gz";
  if (file_exists(base)) return base;
  throw Error("dataset file not found: neither '" + base + ".gz' nor '" + base + "' exists");
}

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

std::vector<std::string> mnist_file_names(bool train) {
  if (train) return {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};
  return {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
}

ImageDataset load_mnist_split(const std::string& dir, bool train, Device device, int64_t limit) {
  CUMULUS_CHECK(limit >= 0, InvalidArgument, "load_mnist_split: limit must be >= 0 (0 keeps all), got ", limit);
  check_device_available(device);
  const auto names = mnist_file_names(train);
  const std::string images_path = find_split_file(dir, names[0]);
  const std::string labels_path = find_split_file(dir, names[1]);

  // With a limit only the first `limit` samples are read (and checked): a gzip file is not
  // inflated past them, so --train-limit stays fast on a large or hostile file.
  IdxArray images = read_idx_u8(images_path, 3, limit);
  CUMULUS_CHECK(images.dims[1] == kRows && images.dims[2] == kCols, Error, "IDX file '", images_path,
                "': images are ", images.dims[1], " x ", images.dims[2], ", expected ", kRows, " x ", kCols);
  IdxArray labels = read_idx_u8(labels_path, 1, limit);
  CUMULUS_CHECK(images.count_in_file == labels.count_in_file, Error, "image and label counts differ: '",
                images_path, "' has ", images.count_in_file, " images, '", labels_path, "' has ",
                labels.count_in_file, " labels");
  for (std::size_t i = 0; i < labels.values.size(); ++i)
    CUMULUS_CHECK(labels.values[i] < kClasses, Error, "IDX file '", labels_path, "': label at index ", i,
                  " is ", int(labels.values[i]), ", expected a class in [0, ", kClasses, ")");

  const int64_t n = images.dims[0];
  CUMULUS_CHECK(labels.dims[0] == n, Error, "internal: read ", n, " images but ", labels.dims[0], " labels");
  std::vector<int32_t> y(labels.values.begin(), labels.values.end());

  MemoryCategoryScope scope(MemoryCategory::data);
  ImageDataset ds;
  ds.num_classes = kClasses;
  ds.images = Tensor::empty(Shape{n, kRows, kCols}, DType::u8, device);
  copy_bytes(ds.images.raw_data(), device, images.values.data(), Device::cpu(), ds.images.nbytes());
  ds.labels = Tensor::from_vector(y, Shape{n}, device);
  return ds;
}

// ---- DataLoader ------------------------------------------------------------------------------

// Note [Host-resident data]
// A dataset kept on the host (a CPU ImageDataset, batches made on a CUDA device) costs the device
// only a ring of two staging slots of batch_size samples (u8 images and i32 labels, category
// data). stage(i, then), called by the host before each gather, (1) marks the slot the previous
// gather read as free (an event on the compute stream, recorded after that gather was queued);
// (2) makes sure batch i is in its slot (normally copied ahead by the previous stage); (3) makes
// the compute stream wait for that copy; (4) starts batch `then` into the other slot: the host
// gathers its rows (in the epoch's order) into a pinned buffer and a copy stream moves them to the
// device once the gather that last read that slot is done. The copy of batch i + 1 thus runs
// while batch i computes. The device gather (the same kernel as for device-resident data, so
// captured CUDA graphs stay valid) reads the slot from the cursor's ring_slot and advances it;
// the host counts slots the same way, which is why each stage() must be followed by exactly one
// gather. The only host wait is for a pinned buffer's previous copy before it is refilled (two
// batches back: normally long finished, and then not counted as a host synchronization). On the
// CPU the option means nothing: the data is already where the batches are made.
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
  int64_t row = 0, batch = 0;     // bytes of one image; samples per slot
  Tensor images, labels;          // device ring: [kSlots * batch, row] u8, [kSlots * batch] i32 (category data)
  uint8_t* pinned = nullptr;      // host ring: per slot batch i32 labels, then batch * row image bytes
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t copied[kSlots] = {};    // the slot's copy to the device is done (copy stream)
  cudaEvent_t consumed[kSlots] = {};  // the gather that read the slot is done (compute stream)
  int64_t holds[kSlots] = {-1, -1};   // the batch each slot holds or is receiving (-1: none)
  uint64_t holds_epoch[kSlots] = {0, 0};
  uint64_t epoch_serial = 1;  // changes with every set_epoch(): a slot filled in another epoch is stale
  int next_slot = 0;          // the slot the next gather reads (the device cursor's ring_slot)
  int pending_consumed = -1;  // the slot of the last staged gather, not yet marked consumed
  int64_t staged = -1;        // the batch stage() made ready for the next gather (-1: none)

  // Rounded up to 4 bytes, so every slot's labels are aligned.
  std::size_t slot_bytes() const { return static_cast<std::size_t>((batch * 4 + batch * row + 3) / 4 * 4); }

  HostStaging(int device_index, int64_t batch_size, int64_t image_bytes) : row(image_bytes), batch(batch_size) {
    cuda::DeviceGuard guard(device_index);
    const Device device = Device::cuda(device_index);
    {
      MemoryCategoryScope scope(MemoryCategory::data);
      OpScope op("host data staging");
      images = Tensor::empty(Shape{kSlots * batch, row}, DType::u8, device);
      labels = Tensor::empty(Shape{kSlots * batch}, DType::i32, device);
    }
    CUMULUS_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kSlots * slot_bytes(), cudaHostAllocDefault));
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

  // Blocks until `e` has completed; counted as a host synchronization only if it had not.
  static void wait_if_pending(cudaEvent_t e) {
    const cudaError_t st = cudaEventQuery(e);
    if (st == cudaSuccess) return;
    if (st != cudaErrorNotReady) CUMULUS_CUDA_CHECK(st);
    cuda::wait_event(e);
  }
#endif
};

DataLoader::DataLoader(const ImageDataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed)
    : DataLoader(dataset, batch_size, shuffle, seed, dataset.images.defined() ? dataset.images.device() : Device::cpu()) {}

DataLoader::DataLoader(const ImageDataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed, Device device)
    : dataset_(dataset), batch_size_(batch_size), shuffle_(shuffle), seed_(seed), device_(device) {
  CUMULUS_CHECK(batch_size > 0, InvalidArgument, "DataLoader: batch_size must be positive, got ", batch_size);
  CUMULUS_CHECK(dataset.images.defined() && dataset.labels.defined(), InvalidArgument,
                "DataLoader: the dataset has no images or labels");
  CUMULUS_CHECK(dataset.images.dtype() == DType::u8 && dataset.images.ndim() == 3, InvalidArgument,
                "DataLoader: images must be u8 [n, rows, cols], got ", dataset.images.str());
  CUMULUS_CHECK(dataset.labels.dtype() == DType::i32 && dataset.labels.ndim() == 1 &&
                    dataset.labels.size(0) == dataset.images.size(0),
                InvalidArgument, "DataLoader: labels must be i32 [", dataset.images.size(0), "], got ",
                dataset.labels.str());
  CUMULUS_CHECK(dataset.labels.device() == dataset.images.device(), DeviceError,
                "DataLoader: images on ", dataset.images.device().str(), " but labels on ",
                dataset.labels.device().str());
  CUMULUS_CHECK(dataset.size() <= std::numeric_limits<int32_t>::max(), InvalidArgument,
                "DataLoader: ", dataset.size(), " samples exceed i32 indices");
  const Device held_on = dataset.images.device();
  CUMULUS_CHECK(held_on == device || (held_on.is_cpu() && device.is_cuda()), DeviceError,
                "DataLoader: batches on ", device.str(), " from a dataset on ", held_on.str(),
                " (a dataset is used on its own device, or kept on the host for a CUDA device)");
  if (held_on != device) {
    check_device_available(device);
#if CUMULUS_WITH_CUDA
    staging_ = std::make_unique<HostStaging>(device.index(), std::min(batch_size, std::max<int64_t>(dataset.size(), 1)),
                                             dataset.images.size(1) * dataset.images.size(2));
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
  if (!cursor_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::data);
    cursor_ = Tensor::zeros(Shape{4}, DType::i32, device_);  // kernels::GatherCursor, 16 bytes
  }
  position_ = i;
  copy_bytes(cursor_.raw_data(), device_, &i, Device::cpu(), sizeof(i));  // the position only
}

void DataLoader::copy_rows_on_host(int64_t i, int64_t count, uint8_t* images_out, int32_t* labels_out) const {
  const int64_t row = dataset_.images.size(1) * dataset_.images.size(2);
  const auto* images = dataset_.images.data<uint8_t>();
  const auto* labels = dataset_.labels.data<int32_t>();
  for (int64_t r = 0; r < count; ++r) {
    const int64_t k = i * batch_size_ + r;
    const int64_t s = shuffle_ ? static_cast<int64_t>(host_order_[static_cast<std::size_t>(k)]) : k;
    std::copy_n(images + s * row, row, images_out + r * row);
    labels_out[r] = labels[s];
  }
}

void DataLoader::stage(int64_t i, int64_t then) {
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::stage(", i, "): the epoch has ",
                num_batches(), " batches");
  if (!staging_) return;
#if CUMULUS_WITH_CUDA
  HostStaging& st = *staging_;
  cuda::DeviceGuard guard(device_.index());
  cuda::Context& ctx = cuda::context(device_.index());
  CUMULUS_CHECK(!ctx.capturing(), InvalidArgument,
                "DataLoader::stage: host-resident data cannot be staged inside a CUDA graph capture; call "
                "stage(i) before the captured micro-batch");
  // Starts the copy of batch b into slot k: once the gather that last read the slot is done, and
  // once the pinned half of the slot has been copied out (two batches back).
  auto fill = [&](int k, int64_t b) {
    HostStaging::wait_if_pending(st.copied[k]);
    const int64_t count = std::min(batch_size_, dataset_.size() - b * batch_size_);
    auto* host_labels = reinterpret_cast<int32_t*>(st.pinned + k * st.slot_bytes());  // 4-aligned
    uint8_t* host_images = st.pinned + k * st.slot_bytes() + st.batch * sizeof(int32_t);
    copy_rows_on_host(b, count, host_images, host_labels);
    CUMULUS_CUDA_CHECK(cudaStreamWaitEvent(st.copy_stream, st.consumed[k], 0));
    auto* device_images = st.images.data<uint8_t>() + k * st.batch * st.row;
    auto* device_labels = st.labels.data<int32_t>() + k * st.batch;
    CUMULUS_CUDA_CHECK(cudaMemcpyAsync(device_images, host_images, static_cast<std::size_t>(count * st.row),
                                       cudaMemcpyHostToDevice, st.copy_stream));
    CUMULUS_CUDA_CHECK(cudaMemcpyAsync(device_labels, host_labels, static_cast<std::size_t>(count) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, st.copy_stream));
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
  st.pending_consumed = k;
  st.next_slot = (k + 1) % HostStaging::kSlots;
  st.staged = i;
  // (4) Batch `then` into the other slot, behind this one's compute.
  if (then >= 0 && then < num_batches()) fill(st.next_slot, then);
#else
  (void)then;
#endif
}

Batch DataLoader::next(int64_t i) {
  if (!cursor_.defined()) seek(i);
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::next(", i, "): the epoch has ",
                num_batches(), " batches");
  position_ = i;
  if (device_.is_cpu()) {
    Batch b = batch(i);
    ++position_;
    return b;
  }
  [[maybe_unused]] int64_t ring = 0, stride = batch_size_;
  [[maybe_unused]] const uint8_t* images = nullptr;
  [[maybe_unused]] const int32_t* labels = nullptr;
  [[maybe_unused]] const int32_t* order = nullptr;
#if CUMULUS_WITH_CUDA
  if (staging_) {
    if (staging_->staged != i) stage(i, i + 1);
    staging_->staged = -1;
    ring = HostStaging::kSlots;
    stride = staging_->batch;
    images = staging_->images.data<uint8_t>();
    labels = staging_->labels.data<int32_t>();
  } else {
    images = dataset_.images.data<uint8_t>();
    labels = dataset_.labels.data<int32_t>();
    order = shuffle_ ? order_.data<int32_t>() : nullptr;
  }
#endif
  Batch b = empty_batch(i);
  [[maybe_unused]] const int64_t count = b.x.size(0), row = b.x.size(1);
  [[maybe_unused]] int32_t* y = b.y.data<int32_t>();
  CUMULUS_DISPATCH_FLOAT(dtype_, T, [[maybe_unused]] T* x = b.x.data<T>();
                         CUMULUS_DISPATCH(device_, ctx, (void)0,
                                          kernels::gather_batch_at_cursor_cuda(
                                              images, labels, order, static_cast<kernels::GatherCursor*>(cursor_.raw_data()),
                                              stride, ring, count, row, x, y, ctx.stream())));
  ++position_;
  return b;
}

DataLoader& DataLoader::set_dtype(DType dtype) {
  CUMULUS_CHECK(is_floating(dtype), InvalidArgument, "DataLoader::set_dtype: batches are f32, bf16 or f16, not ",
                dtype_name(dtype));
  dtype_ = dtype;
  return *this;
}

Batch DataLoader::empty_batch(int64_t i) const {
  const int64_t count = std::min(batch_size_, dataset_.size() - i * batch_size_);
  const int64_t row = dataset_.images.size(1) * dataset_.images.size(2);
  MemoryCategoryScope scope(MemoryCategory::data);
  OpScope op("gather batch");  // an out-of-memory report names the batch, not "(no op)"
  return {Tensor::empty(Shape{count, row}, dtype_, device_), Tensor::empty(Shape{count}, DType::i32, device_)};
}

// Ceiling division without n + b - 1, which overflows for a batch size near INT64_MAX.
int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_.size();
  return n / batch_size_ + (n % batch_size_ != 0 ? 1 : 0);
}

Batch DataLoader::batch(int64_t i) const {
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::batch(", i,
                "): out of range, the epoch has ", num_batches(), " batches");
  const int64_t start = i * batch_size_;
  Batch b = empty_batch(i);
  const int64_t count = b.x.size(0), row = b.x.size(1);
  int32_t* y = b.y.data<int32_t>();
  if (staging_) {
    // Evaluation's synchronous form: the batch's rows gathered on the host, copied as u8 (a
    // quarter of the f32 bytes), scaled on the device by the ordinary gather.
    std::vector<uint8_t> rows(static_cast<std::size_t>(count * row));
    std::vector<int32_t> row_labels(static_cast<std::size_t>(count));
    copy_rows_on_host(i, count, rows.data(), row_labels.data());
    Tensor staged_images, staged_labels;
    {
      MemoryCategoryScope scope(MemoryCategory::data);
      staged_images = Tensor::from_vector(rows, Shape{count, row}, device_);
      staged_labels = Tensor::from_vector(row_labels, Shape{count}, device_);
    }
    [[maybe_unused]] const uint8_t* si = staged_images.data<uint8_t>();
    [[maybe_unused]] const int32_t* sl = staged_labels.data<int32_t>();
    CUMULUS_DISPATCH_FLOAT(
        dtype_, T, [[maybe_unused]] T* x = b.x.data<T>(); CUMULUS_DISPATCH(
            device_, ctx, (void)0, kernels::gather_batch_cuda(si, sl, nullptr, 0, count, row, x, y, ctx.stream())));
    return b;
  }
  const uint8_t* images = dataset_.images.data<uint8_t>();
  const int32_t* labels = dataset_.labels.data<int32_t>();
  const int32_t* order = shuffle_ ? order_.data<int32_t>() : nullptr;
  CUMULUS_DISPATCH_FLOAT(dtype_, T, T* x = b.x.data<T>(); CUMULUS_DISPATCH(
                             device_, ctx, kernels::gather_batch_cpu(images, labels, order, start, count, row, x, y),
                             kernels::gather_batch_cuda(images, labels, order, start, count, row, x, y, ctx.stream())));
  return b;
}

}  // namespace cumulus::data

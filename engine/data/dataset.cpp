// MNIST-format splits loaded once onto the device, and the DataLoader that gathers batches there.
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

DataLoader::DataLoader(const ImageDataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed)
    : dataset_(dataset), batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
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
  set_epoch(0);
}

void DataLoader::set_epoch(int epoch) {
  if (cursor_.defined()) seek(0);
  else position_ = 0;
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
  MemoryCategoryScope scope(MemoryCategory::data);
  Tensor fresh = Tensor::from_vector(order, Shape{n}, dataset_.images.device());
  // Into the same buffer every epoch: a captured gather holds its address.
  if (order_.defined()) order_.copy_from(fresh);
  else order_ = std::move(fresh);
}

void DataLoader::seek(int64_t i) {
  CUMULUS_CHECK(i >= 0 && i <= num_batches(), InvalidArgument, "DataLoader::seek(", i, "): the epoch has ",
                num_batches(), " batches");
  const Device device = dataset_.images.device();
  if (!cursor_.defined()) {
    MemoryCategoryScope scope(MemoryCategory::data);
    cursor_ = Tensor::zeros(Shape{4}, DType::i32, device);  // 16 bytes: i64 position, u32 counter, padding
  }
  position_ = i;
  copy_bytes(cursor_.raw_data(), device, &i, Device::cpu(), sizeof(i));
}

Batch DataLoader::next(int64_t i) {
  if (!cursor_.defined()) seek(i);
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::next(", i, "): the epoch has ",
                num_batches(), " batches");
  position_ = i;
  const Device device = dataset_.images.device();
  if (device.is_cpu()) {
    Batch b = batch(i);
    ++position_;
    return b;
  }
  Batch b = empty_batch(i);
  [[maybe_unused]] const int64_t count = b.x.size(0), row = b.x.size(1);
  [[maybe_unused]] const uint8_t* images = dataset_.images.data<uint8_t>();
  [[maybe_unused]] const int32_t* labels = dataset_.labels.data<int32_t>();
  [[maybe_unused]] const int32_t* order = shuffle_ ? order_.data<int32_t>() : nullptr;
  [[maybe_unused]] auto* cursor = static_cast<int64_t*>(cursor_.raw_data());
  [[maybe_unused]] auto* done = reinterpret_cast<uint32_t*>(cursor + 1);
  [[maybe_unused]] float* x = b.x.data<float>();
  [[maybe_unused]] int32_t* y = b.y.data<int32_t>();
  CUMULUS_DISPATCH(device, (void)0,
                   kernels::gather_batch_at_cursor_cuda(images, labels, order, cursor, done, batch_size_, 0, count, row, x,
                                                        y, ctx.stream()));
  ++position_;
  return b;
}

Batch DataLoader::empty_batch(int64_t i) const {
  const int64_t count = std::min(batch_size_, dataset_.size() - i * batch_size_);
  const int64_t row = dataset_.images.size(1) * dataset_.images.size(2);
  const Device device = dataset_.images.device();
  MemoryCategoryScope scope(MemoryCategory::data);
  OpScope op("gather batch");  // an out-of-memory report names the batch, not "(no op)"
  return {Tensor::empty(Shape{count, row}, DType::f32, device), Tensor::empty(Shape{count}, DType::i32, device)};
}

// Ceiling division without n + b - 1, which overflows for a batch size near INT64_MAX.
int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_.size();
  return n / batch_size_ + (n % batch_size_ != 0 ? 1 : 0);
}

Batch DataLoader::batch(int64_t i) const {
  CUMULUS_CHECK(i >= 0 && i < num_batches(), InvalidArgument, "DataLoader::batch(", i,
                "): out of range, the epoch has ", num_batches(), " batches");
  const Device device = dataset_.images.device();
  const int64_t start = i * batch_size_;
  Batch b = empty_batch(i);
  const int64_t count = b.x.size(0), row = b.x.size(1);
  const uint8_t* images = dataset_.images.data<uint8_t>();
  const int32_t* labels = dataset_.labels.data<int32_t>();
  const int32_t* order = shuffle_ ? order_.data<int32_t>() : nullptr;
  float* x = b.x.data<float>();
  int32_t* y = b.y.data<int32_t>();
  CUMULUS_DISPATCH(device, kernels::gather_batch_cpu(images, labels, order, start, count, row, x, y),
                   kernels::gather_batch_cuda(images, labels, order, start, count, row, x, y, ctx.stream()));
  return b;
}

}  // namespace cumulus::data

// Datasets and the DataLoader (docs/ARCHITECTURE.md, "Data"). A TensorDataset is any tensors that
// share their first dimension, as PyTorch's: f32, i32, i64 or u8, of any trailing shape. The
// DataLoader gathers each batch's rows of every tensor by index in one kernel (shuffled on the
// device from a seed), converting the floating ones to the batch dtype on the way. The dataset lives
// on the training device (no per-batch host copies) or, for a dataset the device should not hold,
// on the host: then batches are staged through pinned memory and copied one micro-batch ahead on a
// copy stream (Note [Host-resident data] in engine/data/dataset.cpp). Image classification is one
// use: u8 pixels scaled to [0, 1] by to_float(k, 255) (models/fashion_mnist.h is such a dataset).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::data {

// Tensors sharing their first dimension (the samples), as PyTorch's TensorDataset(x, y): f32, i32,
// i64 or u8, of any shape [n, ...] (up to 8-D), all on one device: the device batches are made on,
// or the host for a CUDA loader (host-resident data). The tensors are shared, not copied.
class TensorDataset {
 public:
  TensorDataset() = default;
  // `names` (one per tensor, or none) name the tensors in messages: "tensor 1 ('labels')". Throws
  // ShapeError naming the tensors and their shapes when first dimensions differ, InvalidArgument
  // for another dtype or a 0-d tensor, DeviceError for tensors on different devices.
  explicit TensorDataset(std::vector<Tensor> tensors, std::vector<std::string> names = {});
  // Batches of tensor k as floating point: float(value) / divisor computed in f32 and stored in the
  // loader's dtype (f32, or bf16 / f16 with DataLoader::set_dtype), rounded once. The image path:
  // u8 pixels with divisor 255 (torchvision's ToTensor). f32 tensors are floating without it.
  TensorDataset& to_float(std::size_t k, float divisor = 1.0f);
  // Samples [begin, begin + count) of every tensor (views, no copy) with the same names and
  // to_float conversions: a train/test split of one table. Out of range is an InvalidArgument.
  TensorDataset slice(int64_t begin, int64_t count) const;
  // The units a row holds: what a training loss is summed over, per row (Note [Units] in
  // engine/train/trainer.cpp). 1 (the default): a row is a sample (a classifier's image). A language
  // model's rows are sequences of T tokens, each a unit: set_units_per_row(T). Every Batch says how
  // many it holds (Batch::units = rows x this), and the Trainer, the planner's request and the
  // memory tracker count the same units. Kept by slice().
  TensorDataset& set_units_per_row(int64_t units);
  int64_t units_per_row() const { return units_per_row_; }

  int64_t size() const { return tensors_.empty() ? 0 : tensors_[0].size(0); }  // rows (samples)
  int64_t units() const { return size() * units_per_row_; }                    // rows x units_per_row
  std::size_t num_tensors() const { return tensors_.size(); }
  const Tensor& tensor(std::size_t k) const;
  std::string describe(std::size_t k) const;  // "tensor 1 ('labels')", as messages name it
  // Whether tensor k's batches are floating point (in the loader's dtype): f32, or to_float.
  bool floating(std::size_t k) const;
  float divisor(std::size_t k) const;  // 1 unless to_float said otherwise
  Device device() const { return tensors_.empty() ? Device::cpu() : tensors_[0].device(); }

 private:
  std::vector<Tensor> tensors_;
  std::vector<std::string> names_;
  std::vector<float> divisors_;  // per tensor: 0 unless to_float
  int64_t units_per_row_ = 1;
};

// A batch of b samples (rows): every dataset tensor's rows [b, ...] in the dataset's order, in
// category data. x and y are the first two (a dataset of inputs and targets); y is undefined with
// one tensor. `units` is what a loss summed over the batch counts: b x the dataset's units per row
// (b for samples, b x T for sequences of T tokens); Trainer::train_epoch passes it on.
// From u8 images with to_float(0, 255): x is [b, rows * cols] in [0, 1] in the loader's dtype.
struct Batch {
  Tensor x;
  Tensor y;
  std::vector<Tensor> tensors;
  int64_t units = 0;
};

class DataLoader {
 public:
  static constexpr std::size_t kMaxTensors = 8;
  // Batches of `batch_size` in dataset order, or in a permutation drawn per epoch from `seed` when
  // `shuffle` (the same seed and epoch give the same order on every device and after a resume).
  // The last batch of an epoch may be smaller (drop_last = false, as PyTorch's default).
  // Batches are made on `device` (default: the dataset's). A dataset on the CPU with a CUDA
  // `device` is host-resident: only two staging slots of batch_size samples live on the device.
  // At most kMaxTensors tensors (one kernel argument carries them all).
  DataLoader(const TensorDataset& dataset, int64_t batch_size, bool shuffle = false, uint64_t seed = 0);
  DataLoader(const TensorDataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed, Device device);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  void set_epoch(int epoch);  // draws that epoch's order (no-op without shuffle)
  int64_t num_batches() const;
  int64_t batch_size() const { return batch_size_; }
  // Rows of batch i (batch_size, or fewer for the epoch's last) and its units (rows x the dataset's
  // units per row): what Batch::units of batch i says, known without making it.
  int64_t rows(int64_t i) const;
  int64_t units(int64_t i) const { return rows(i) * dataset_.units_per_row(); }
  // The type floating batches are made in (TensorDataset::floating; integer tensors keep theirs):
  // f32 (the default), or bf16 / f16 for mixed precision, where the batch is the first activation
  // of the compute type (pixel / 255 computed in f32, rounded once).
  DataLoader& set_dtype(DType dtype);
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool host_resident() const { return staging_ != nullptr; }
  // Batches are read in order from a cursor: seek(i), then next(i), next(i + 1), ... (training,
  // evaluation and a planner's probe alike); tensors are made in category data. The position lives
  // on the device and the gather kernel advances it itself, so the same launch (the same kernel
  // arguments) gathers every batch of a size: it can be captured in a CUDA graph and replayed, and a
  // replay, which does not run this host code, still gathers the right batch. `i` must be the
  // cursor's position; it serves the host's checks and the batch size (the last batch may be
  // smaller). seek() is queued, no synchronization. Host-resident data is staged by next() itself,
  // the following batch copied behind it (a Trainer replaying CUDA graphs stages it before each
  // replay, outside the captured work).
  void seek(int64_t i);
  Batch next(int64_t i);
  int64_t position() const { return position_; }
  const TensorDataset& dataset() const { return dataset_; }

 private:
  friend struct DataLoaderAccess;  // the Trainer's staging under CUDA graphs (engine/data/loader_access.h)
  struct HostStaging;  // the pinned ring, its device twin, the copy stream and events (CUDA builds)
  Batch empty_batch(int64_t i) const;  // batch i's tensors (category data), unwritten
  Batch gather_on_cpu(int64_t i) const;  // a CPU loader's batch i (no cursor: nothing replays it)
  // Host-resident data only (a no-op otherwise): makes batch i ready on the device for the next
  // gather and starts copying batch `then` (none when out of range) behind it. Each stage() is
  // followed by exactly one gather (next(i), or the replay of a graph that holds one).
  void stage(int64_t i, int64_t then);
  // Host-resident data: the first `count` rows of batch i (in the epoch's order) of tensor k, as
  // their bytes, to `out`.
  void copy_rows_on_host(std::size_t k, int64_t i, int64_t count, uint8_t* out) const;

  TensorDataset dataset_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  Device device_;
  DType dtype_ = DType::f32;
  std::vector<int32_t> host_order_;  // host-resident data: the current epoch's permutation (shuffle only)
  Tensor order_;  // [n] i32 on the device: the current epoch's permutation (device-resident, shuffle only)
  Tensor cursor_;         // CUDA loaders: kernels::GatherCursor (kernels/gather.h) on the device
  int64_t position_ = 0;  // the host's copy of the position
  std::unique_ptr<HostStaging> staging_;
};

}  // namespace cumulus::data

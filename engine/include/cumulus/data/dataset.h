// Image classification datasets held on the device as uint8 (Fashion-MNIST is 55 MB that way),
// and a DataLoader that gathers each batch there by index and scales it to [0, 1] in one kernel
// (docs/ARCHITECTURE.md, "Data"): no per-batch host copies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cumulus/tensor/tensor.h"

namespace cumulus::data {

struct ImageDataset {
  Tensor images;  // [n, rows, cols] u8, category data
  Tensor labels;  // [n] i32 in [0, num_classes), category data
  int64_t num_classes = 10;
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
};

// The Fashion-MNIST (or MNIST) split in `dir`: train-images-idx3-ubyte(.gz) and
// train-labels-idx1-ubyte(.gz), or the t10k-* pair for the test split. Checks that counts agree,
// that images are 28 x 28, and that every label is in [0, 10) (an Error names the file, the index
// and the value otherwise). `limit` > 0 keeps the first `limit` samples and reads only those (a
// gzip file is not inflated past them; the counts in both headers are still compared). Uploaded
// to `device` once.
ImageDataset load_mnist_split(const std::string& dir, bool train, Device device, int64_t limit = 0);

// The file names of a split, without the .gz suffix, in the order images, labels.
std::vector<std::string> mnist_file_names(bool train);

struct Batch {
  Tensor x;  // [b, rows * cols] f32 in [0, 1] (pixel / 255, as torchvision's ToTensor)
  Tensor y;  // [b] i32
};

class DataLoader {
 public:
  // Batches of `batch_size` in dataset order, or in a permutation drawn per epoch from `seed` when
  // `shuffle` (the same seed and epoch give the same order on every device and after a resume).
  // The last batch of an epoch may be smaller (drop_last = false, as PyTorch's default).
  DataLoader(const ImageDataset& dataset, int64_t batch_size, bool shuffle = false, uint64_t seed = 0);

  void set_epoch(int epoch);  // draws that epoch's order (no-op without shuffle)
  int64_t num_batches() const;
  int64_t batch_size() const { return batch_size_; }
  // Batch i of the current epoch; tensors are made in category data.
  Batch batch(int64_t i) const;
  // The training loop's form: batch i, where i must be the device cursor's position (seek(i), or
  // the batch after the previous next()). The position lives on the device and the gather kernel
  // advances it itself, so the same launch (the same kernel arguments) gathers every batch of a
  // size: it can be captured in a CUDA graph and replayed, and a replay, which does not run this
  // host code, still gathers the right batch. `i` serves the host's checks and the batch size
  // (the last batch may be smaller). seek() is queued, no synchronization.
  void seek(int64_t i);
  Batch next(int64_t i);
  int64_t position() const { return position_; }
  const ImageDataset& dataset() const { return dataset_; }

 private:
  Batch empty_batch(int64_t i) const;  // batch i's tensors (category data), unwritten

  ImageDataset dataset_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  Tensor order_;  // [n] i32 on the device: the current epoch's permutation (shuffle only)
  Tensor cursor_;  // on the device: {i64 position, u32 blocks done} (kernels/cuda/data.cu)
  int64_t position_ = 0;  // the host's copy of the position
};

}  // namespace cumulus::data

// Fashion-MNIST: Zalando's 28 x 28 grey images of clothing in 10 classes, 60000 for training and
// 10000 for testing, in MNIST's IDX files (MNIST's own files load the same way). Its files are
// found, or downloaded and verified, and a split is loaded once onto a device (or kept on the host)
// as a dataset for a DataLoader: the u8 pixels become pixel / 255 as each batch is gathered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/data/dataset.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus::models {

struct FashionMnistSplit {
  Tensor images;  // [n, rows, cols] u8, category data
  Tensor labels;  // [n] i32 in [0, num_classes), category data
  int64_t num_classes = 10;
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
  // The TensorDataset a DataLoader gathers from: "images" viewed as [n, rows * cols] and scaled to
  // [0, 1] (to_float, divisor 255, as torchvision's ToTensor), then "labels". Checks the dtypes,
  // shapes and devices above (InvalidArgument, DeviceError).
  data::TensorDataset tensors() const;
};

// The split in `dir`: train-images-idx3-ubyte(.gz) and train-labels-idx1-ubyte(.gz), or the
// t10k-* pair for the test split. Checks that counts agree, that images are 28 x 28, and that every
// label is in [0, 10) (an Error names the file, the index and the value otherwise). `limit` > 0
// keeps the first `limit` samples and reads only those (a gzip file is not inflated past them; the
// counts in both headers are still compared). Uploaded to `device` once.
FashionMnistSplit load_fashion_mnist(const std::string& dir, bool train, Device device, int64_t limit = 0);

// The file names of a split, without the .gz suffix, in the order images, labels.
std::vector<std::string> fashion_mnist_file_names(bool train);

// Where locate_fashion_mnist looks, and how its messages address the user.
struct FashionMnistSearch {
  std::string dir;         // a directory that must hold the files; empty: search the usual places
  std::string dir_option;  // how the user gives `dir` ("--data"), named in messages; empty: none
  bool quiet = false;      // no progress lines on stderr
};

// The directory to read Fashion-MNIST from. Search order: search.dir, $CUMULUS_DATA,
// ./data/fashion-mnist, ../shared/data/fashion-mnist. A directory counts when it holds all four
// files (each as NAME.gz or NAME). search.dir or $CUMULUS_DATA without them is an InvalidArgument
// naming what is missing. When no candidate holds them, the files are downloaded with curl from the
// dataset's repository (or Zalando's mirror) into ./data/fashion-mnist and their SHA-256 sums
// checked (io::sha256_of_file) before use. Without curl or sha256sum on $PATH that is an Error
// saying what to install, raised before anything is created; a failed download or a wrong sum is
// an Error giving the URLs and what to do, and leaves no partial file and no directory this call
// created empty (verified files stay, so a retry fetches only the rest). In the directory found,
// each split's images and labels are checked against each other from their headers
// (data::check_idx_pair) before anything is inflated: an Error.
std::string locate_fashion_mnist(const FashionMnistSearch& search = {});

}  // namespace cumulus::models

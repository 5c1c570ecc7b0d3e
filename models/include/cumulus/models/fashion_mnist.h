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
#include "cumulus/nn/model.h"
#include "cumulus/plan/planner.h"
#include "cumulus/train/trainer.h"
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

// The levers a planner request for a classifier trained on Fashion-MNIST sets or weighs (Note [Plan
// levers] in engine/plan/planner.cpp).
struct FashionMnistLevers {
  bool recompute = false;        // fixed: every recompute segment of the model (the table says "all")
  bool weigh_recompute = false;  // every subset of the model's recompute segments
  bool data_on_host = false;     // fixed: both splits in host memory, each batch staged
  bool weigh_placement = false;  // the splits on the device or the host (on the CPU they are the same)
  bool weigh_bf16 = false;       // bf16 batches beside `batch_dtype`, where the device has bf16
};

// A planner request (train::plan_request, each probe reading `train` where the last setting put it)
// for training `model` with `optimizer` and `loss` on `train`, `effective_batch` samples under
// `budget` reserved bytes (0: none), with `levers`. Its apply sets the model's recompute segments
// (weigh_recompute), moves both `train` and `test` (their memory is the run's) to where the setting
// places the data, and sets the batches' dtype. require_fit is set, as plan_request's.
plan::PlanRequest plan_request(nn::Model& model, optim::Optimizer& optimizer, const train::BatchLoss& loss,
                               FashionMnistSplit& train, FashionMnistSplit& test, int64_t effective_batch,
                               int64_t budget, DType batch_dtype, const FashionMnistLevers& levers);

}  // namespace cumulus::models

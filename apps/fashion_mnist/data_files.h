// Finding the Fashion-MNIST files, or downloading and verifying them.
#pragma once

#include <string>

namespace fmnist {

// The directory to read the dataset from. Search order: `data_flag` (--data), $CUMULUS_DATA,
// ./data/fashion-mnist, ../shared/data/fashion-mnist. A directory counts when it holds all four
// files (each as NAME.gz or NAME). --data or $CUMULUS_DATA without them is a UsageFailure naming
// what is missing. When no candidate holds them, the files are downloaded with curl from the
// canonical location into ./data/fashion-mnist and their SHA-256 sums (sha256sum) checked before
// use. Without curl or sha256sum on $PATH that is a cumulus::Error saying what to install, raised
// before anything is created; a failed download or a wrong sum is a cumulus::Error giving the
// URLs and what to do, and leaves no partial file and no directory this call created empty.
// The directory found, its images and labels files are checked against each other from their
// headers (cumulus::data::check_idx_pair) before anything is inflated: a cumulus::Error.
std::string locate_fashion_mnist(const std::string& data_flag, bool quiet);

}  // namespace fmnist

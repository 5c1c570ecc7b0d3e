// Finding the Fashion-MNIST files, or downloading and verifying them (models::locate_fashion_mnist).
#pragma once

#include <string>

namespace fmnist {

// models::locate_fashion_mnist with `data_flag` (--data) as the directory: --data or $CUMULUS_DATA
// without the four files is a UsageFailure naming what is missing; every other fault (no curl or
// sha256sum, a failed download, a wrong sum, mismatched headers) a cumulus::Error.
std::string locate_fashion_mnist(const std::string& data_flag, bool quiet);

}  // namespace fmnist

#include "data_files.h"

#include "cumulus/core/error.h"
#include "cumulus/models/fashion_mnist.h"
#include "options.h"

namespace fmnist {

std::string locate_fashion_mnist(const std::string& data_flag, bool quiet) {
  cumulus::models::FashionMnistSearch search;
  search.dir = data_flag;
  search.dir_option = "--data";
  search.quiet = quiet;
  try {
    return cumulus::models::locate_fashion_mnist(search);
  } catch (const cumulus::InvalidArgument& e) {  // the directory given lacks files: a usage error
    throw UsageFailure(e.what());
  }
}

}  // namespace fmnist

#include "cumulus/models/fashion_mnist.h"

#include <sys/wait.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cumulus/core/error.h"
#include "cumulus/data/idx.h"
#include "cumulus/io/checksum.h"
#include "cumulus/memory/category.h"

namespace cumulus::models {

namespace fs = std::filesystem;

// ---- loading a split -------------------------------------------------------------------------

namespace {

constexpr int64_t kRows = 28, kCols = 28, kClasses = 10;

// dir/NAME.gz if present, else dir/NAME.
std::string find_split_file(const std::string& dir, const std::string& name) {
  const std::string base = (dir.empty() || dir.back() == '/') ? dir + name : dir + "/" + name;
  std::error_code ec;
  if (fs::exists(base + ".gz", ec)) return base + ".gz";
  if (fs::exists(base, ec)) return base;
  throw Error("dataset file not found: neither '" + base + ".gz' nor '" + base + "' exists");
}

}  // namespace

std::vector<std::string> fashion_mnist_file_names(bool train) {
  if (train) return {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};
  return {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
}

FashionMnistSplit load_fashion_mnist(const std::string& dir, bool train, Device device, int64_t limit) {
  CUMULUS_CHECK(limit >= 0, InvalidArgument, "load_fashion_mnist: limit must be >= 0 (0 keeps all), got ", limit);
  check_device_available(device);
  const auto names = fashion_mnist_file_names(train);
  const std::string images_path = find_split_file(dir, names[0]);
  const std::string labels_path = find_split_file(dir, names[1]);

  // With a limit only the first `limit` samples are read (and checked): a gzip file is not
  // inflated past them, so a small limit stays fast on a large or hostile file.
  data::IdxArray images = data::read_idx_u8(images_path, 3, limit);
  CUMULUS_CHECK(images.dims[1] == kRows && images.dims[2] == kCols, Error, "IDX file '", images_path, "': images are ",
                images.dims[1], " x ", images.dims[2], ", expected ", kRows, " x ", kCols);
  data::IdxArray labels = data::read_idx_u8(labels_path, 1, limit);
  CUMULUS_CHECK(images.count_in_file == labels.count_in_file, Error, "image and label counts differ: '", images_path,
                "' has ", images.count_in_file, " images, '", labels_path, "' has ", labels.count_in_file, " labels");
  for (std::size_t i = 0; i < labels.values.size(); ++i)
    CUMULUS_CHECK(labels.values[i] < kClasses, Error, "IDX file '", labels_path, "': label at index ", i, " is ",
                  int(labels.values[i]), ", expected a class in [0, ", kClasses, ")");

  const int64_t n = images.dims[0];
  CUMULUS_CHECK(labels.dims[0] == n, Error, "internal: read ", n, " images but ", labels.dims[0], " labels");
  std::vector<int32_t> y(labels.values.begin(), labels.values.end());

  MemoryCategoryScope scope(MemoryCategory::data);
  FashionMnistSplit split;
  split.num_classes = kClasses;
  split.images = Tensor::empty(Shape{n, kRows, kCols}, DType::u8, device);
  copy_bytes(split.images.raw_data(), device, images.values.data(), Device::cpu(), split.images.nbytes());
  split.labels = Tensor::from_vector(y, Shape{n}, device);
  return split;
}

data::TensorDataset FashionMnistSplit::tensors() const {
  CUMULUS_CHECK(images.defined() && labels.defined(), InvalidArgument,
                "DataLoader: the dataset has no images or labels");
  CUMULUS_CHECK(images.dtype() == DType::u8 && images.ndim() == 3, InvalidArgument,
                "DataLoader: images must be u8 [n, rows, cols], got ", images.str());
  CUMULUS_CHECK(labels.dtype() == DType::i32 && labels.ndim() == 1 && labels.size(0) == images.size(0), InvalidArgument,
                "DataLoader: labels must be i32 [", images.size(0), "], got ", labels.str());
  CUMULUS_CHECK(labels.device() == images.device(), DeviceError, "DataLoader: images on ", images.device().str(),
                " but labels on ", labels.device().str());
  data::TensorDataset ds({images.flatten(1), labels}, {"images", "labels"});
  ds.to_float(0, 255.0f);  // pixel / 255, as torchvision's ToTensor
  return ds;
}

// ---- finding or fetching the files -----------------------------------------------------------

namespace {

struct FileInfo {
  const char* name;
  const char* sha256;  // of the .gz release files (the official files, checked in shared/)
};

constexpr std::array<FileInfo, 4> kFiles = {{
    {"train-images-idx3-ubyte.gz", "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
    {"train-labels-idx1-ubyte.gz", "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
    {"t10k-images-idx3-ubyte.gz", "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
    {"t10k-labels-idx1-ubyte.gz", "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"},
}};

// The canonical location (the dataset's repository) first, then Zalando's S3 mirror.
constexpr std::array<const char*, 2> kBaseUrls = {
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"};

constexpr const char* kDownloadDir = "data/fashion-mnist";

std::vector<std::string> missing_files(const fs::path& dir) {
  std::vector<std::string> missing;
  std::error_code ec;
  for (const FileInfo& f : kFiles) {
    const std::string gz = f.name, plain = gz.substr(0, gz.size() - 3);
    if (!fs::is_regular_file(dir / gz, ec) && !fs::is_regular_file(dir / plain, ec)) missing.push_back(gz);
  }
  return missing;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string file_list() {
  std::string s;
  for (const FileInfo& f : kFiles) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// What to do when the files cannot be had here, for every download error.
std::string what_to_do(const FashionMnistSearch& search, const fs::path& dir) {
  const std::string give_dir =
      search.dir_option.empty() ? "set $CUMULUS_DATA" : "pass " + search.dir_option + " DIR (or set $CUMULUS_DATA)";
  return "download the four files (" + file_list() + ") from " + kBaseUrls[0] + " into " + dir.string() + ", or " +
         give_dir + " to a directory holding them";
}

// Removes the download's leftovers: the directories this run created, if they stayed empty.
// Verified files stay, so a retry fetches only the rest.
void clean_up(const std::vector<fs::path>& created) {
  std::error_code ec;
  for (auto it = created.rbegin(); it != created.rend(); ++it)
    if (fs::is_directory(*it, ec) && fs::is_empty(*it, ec)) fs::remove(*it, ec);
}

void download(const FashionMnistSearch& search, const fs::path& dir, const FileInfo& f) {
  const fs::path target = dir / f.name;
  const fs::path tmp = dir / (std::string(f.name) + ".part");
  // Whatever happens below, no partial file stays behind (after the rename there is none).
  struct RemovePart {
    const fs::path& path;
    ~RemovePart() {
      std::error_code ec;
      fs::remove(path, ec);
    }
  } remove_part{tmp};
  std::string tried;
  for (const char* base : kBaseUrls) {
    const std::string url = std::string(base) + f.name;
    tried += (tried.empty() ? "" : ", ") + url;
    if (!search.quiet) std::fprintf(stderr, "downloading %s\n", url.c_str());
    const std::string cmd = "curl -fsSL --retry 2 --connect-timeout 20 -o " + shell_quote(tmp.string()) + " " +
                            shell_quote(url) + (search.quiet ? " 2>/dev/null" : "");
    const int status = std::system(cmd.c_str());
    if (status != -1 && WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM))
      throw Error(std::string("download of ") + f.name + " interrupted");
    std::error_code ec;
    if (status != 0 || !fs::is_regular_file(tmp, ec)) continue;
    const std::string sum = io::sha256_of_file(tmp.string());
    if (sum != f.sha256) {
      throw Error("downloaded " + url + " but its SHA-256 is " + sum + ", expected " + f.sha256 +
                  "; the file was discarded");
    }
    fs::rename(tmp, target);
    return;
  }
  throw Error(std::string("could not download ") + f.name + " with curl (tried " + tried +
              "; is the network reachable, a proxy needed (https_proxy), ca-certificates installed?); " +
              what_to_do(search, dir));
}

// Downloads the files into ./data/fashion-mnist; `searched` says where they were looked for.
std::string fetch(const FashionMnistSearch& search, const std::string& searched) {
  const fs::path dir = kDownloadDir;
  // Checked before anything is created, so a machine without the tools is told what to install
  // and left as it was.
  for (const char* tool : {"curl", "sha256sum"})
    if (!io::program_on_path(tool))
      throw Error(std::string("Fashion-MNIST not found (") + searched + ") and " + tool +
                  ", needed to download and verify it, is not installed (Debian: apt-get install " +
                  (std::string(tool) == "curl" ? "curl ca-certificates" : "coreutils") +
                  ", or scripts/install-deps.sh); or " + what_to_do(search, dir));
  std::vector<fs::path> created;
  std::error_code ec;
  for (const fs::path& d : {dir.parent_path(), dir})
    if (!fs::exists(d, ec)) created.push_back(d);
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir.string() + " for the download: " + ec.message());
  if (!search.quiet)
    std::fprintf(stderr, "Fashion-MNIST not found (%s); downloading into %s\n", searched.c_str(), dir.c_str());
  try {
    for (const FileInfo& f : kFiles)
      if (!fs::is_regular_file(dir / f.name)) download(search, dir, f);
  } catch (...) {
    clean_up(created);
    throw;
  }
  return dir.string();
}

std::string find_or_fetch(const FashionMnistSearch& search) {
  if (!search.dir.empty()) {
    const auto missing = missing_files(search.dir);
    const std::string named = search.dir_option.empty() ? "directory" : search.dir_option;
    CUMULUS_CHECK(missing.empty(), InvalidArgument, named, " '", search.dir, "' lacks ", join(missing));
    return search.dir;
  }
  if (const char* env = std::getenv("CUMULUS_DATA"); env != nullptr && *env != '\0') {
    const auto missing = missing_files(env);
    CUMULUS_CHECK(missing.empty(), InvalidArgument, "$CUMULUS_DATA '", env, "' lacks ", join(missing));
    return env;
  }
  for (const char* candidate : {kDownloadDir, "../shared/data/fashion-mnist"})
    if (missing_files(candidate).empty()) return candidate;
  const std::string searched = (search.dir_option.empty() ? "" : search.dir_option + ", ") +
                               "$CUMULUS_DATA, ./data/fashion-mnist, ../shared/data/fashion-mnist";
  return fetch(search, searched);
}

// Both splits' images and labels checked against each other from their headers, before either
// is inflated (Note [Allocate only what arrived] in engine/data/idx.cpp): the files
// load_fashion_mnist reads, NAME.gz before NAME.
void check_split_headers(const fs::path& dir) {
  for (const bool train : {true, false}) {
    std::vector<std::string> paths;
    for (const std::string& name : fashion_mnist_file_names(train)) {
      std::error_code ec;
      paths.push_back(fs::exists(dir / (name + ".gz"), ec) ? (dir / (name + ".gz")).string() : (dir / name).string());
    }
    data::check_idx_pair(paths[0], paths[1]);
  }
}

}  // namespace

std::string locate_fashion_mnist(const FashionMnistSearch& search) {
  const std::string dir = find_or_fetch(search);
  check_split_headers(dir);
  return dir;
}

plan::PlanRequest plan_request(nn::Model& model, optim::Optimizer& optimizer, const train::BatchLoss& loss,
                               FashionMnistSplit& train, FashionMnistSplit& test, int64_t effective_batch,
                               int64_t budget, DType batch_dtype, const FashionMnistLevers& levers) {
  plan::PlanRequest request = train::plan_request(
      optimizer, [&train] { return train.tensors(); }, loss, effective_batch, budget, batch_dtype);
  if (levers.recompute) request.setting.recompute = 1;  // shown as "all" (no segment names)
  request.setting.data = levers.data_on_host ? plan::DataPlacement::host : plan::DataPlacement::device;
  if (levers.weigh_recompute) request.recompute_segments = model.recompute_segment_names();
  request.weigh_placement = levers.weigh_placement;
  if (levers.weigh_bf16 && precision_unsupported_reason(Precision::bf16, request.device).empty())
    request.precisions = {Precision::bf16};
  request.apply = [&model, &train, &test, levers, device = request.device,
                   set_dtype = request.apply](const plan::PlanSetting& s) {
    if (levers.weigh_recompute) model.set_recompute_segments(s.recompute);
    const Device where = s.data == plan::DataPlacement::host ? Device::cpu() : device;
    const MemoryCategoryScope scope(MemoryCategory::data);
    for (FashionMnistSplit* set : {&train, &test})
      *set = FashionMnistSplit{set->images.to(where), set->labels.to(where), set->num_classes};
    set_dtype(s);
  };
  request.model = &model;
  return request;
}

}  // namespace cumulus::models

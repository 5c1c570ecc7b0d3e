#include "data_files.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/data/dataset.h"
#include "cumulus/data/idx.h"
#include "options.h"

namespace fmnist {

namespace fs = std::filesystem;

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

// Whether `program` is an executable file in a directory of $PATH (what the shell would run).
bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string file_list() {
  std::string s;
  for (const FileInfo& f : kFiles) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// What to do when the files cannot be had here, for every download error.
std::string what_to_do(const fs::path& dir) {
  return "download the four files (" + file_list() + ") from " + kBaseUrls[0] + " into " + dir.string() +
         ", or pass --data DIR (or set $CUMULUS_DATA) to a directory holding them";
}

// Removes the download's leftovers: the directories this run created, if they stayed empty.
// Verified files stay, so a retry fetches only the rest.
void clean_up(const std::vector<fs::path>& created) {
  std::error_code ec;
  for (auto it = created.rbegin(); it != created.rend(); ++it)
    if (fs::is_directory(*it, ec) && fs::is_empty(*it, ec)) fs::remove(*it, ec);
}

// SHA-256 through coreutils' sha256sum: present wherever curl is, and not worth a hand-written hash.
std::string sha256_of(const fs::path& file) {
  const std::string cmd = "sha256sum " + shell_quote(file.string()) + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) throw cumulus::Error("cannot run sha256sum to verify " + file.string());
  char buf[65] = {};
  const std::size_t n = std::fread(buf, 1, 64, p);
  const int status = ::pclose(p);
  if (n != 64 || status != 0) throw cumulus::Error("sha256sum failed on " + file.string());
  return std::string(buf, 64);
}

void download(const fs::path& dir, const FileInfo& f, bool quiet) {
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
    if (!quiet) std::fprintf(stderr, "downloading %s\n", url.c_str());
    const std::string cmd = "curl -fsSL --retry 2 --connect-timeout 20 -o " + shell_quote(tmp.string()) + " " +
                            shell_quote(url) + (quiet ? " 2>/dev/null" : "");
    const int status = std::system(cmd.c_str());
    if (status != -1 && WIFSIGNALED(status) && (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM))
      throw cumulus::Error(std::string("download of ") + f.name + " interrupted");
    std::error_code ec;
    if (status != 0 || !fs::is_regular_file(tmp, ec)) continue;
    const std::string sum = sha256_of(tmp);
    if (sum != f.sha256) {
      throw cumulus::Error("downloaded " + url + " but its SHA-256 is " + sum + ", expected " + f.sha256 +
                           "; the file was discarded");
    }
    fs::rename(tmp, target);
    return;
  }
  throw cumulus::Error(std::string("could not download ") + f.name + " with curl (tried " + tried +
                       "; is the network reachable, a proxy needed (https_proxy), ca-certificates installed?); " +
                       what_to_do(dir));
}

}  // namespace

namespace {

// Both splits' images and labels checked against each other from their headers, before either
// is inflated (Note [Allocate only what arrived] in engine/data/idx.cpp): the files
// load_mnist_split reads, NAME.gz before NAME.
void check_split_headers(const fs::path& dir) {
  for (const bool train : {true, false}) {
    std::vector<std::string> paths;
    for (const std::string& name : cumulus::data::mnist_file_names(train)) {
      std::error_code ec;
      paths.push_back(fs::exists(dir / (name + ".gz"), ec) ? (dir / (name + ".gz")).string() : (dir / name).string());
    }
    cumulus::data::check_idx_pair(paths[0], paths[1]);
  }
}

std::string find_fashion_mnist(const std::string& data_flag, bool quiet) {
  if (!data_flag.empty()) {
    const auto missing = missing_files(data_flag);
    if (!missing.empty()) throw UsageFailure("--data '" + data_flag + "' lacks " + join(missing));
    return data_flag;
  }
  if (const char* env = std::getenv("CUMULUS_DATA"); env != nullptr && *env != '\0') {
    const auto missing = missing_files(env);
    if (!missing.empty()) throw UsageFailure(std::string("$CUMULUS_DATA '") + env + "' lacks " + join(missing));
    return env;
  }
  for (const char* candidate : {"data/fashion-mnist", "../shared/data/fashion-mnist"})
    if (missing_files(candidate).empty()) return candidate;

  const fs::path dir = "data/fashion-mnist";
  const std::string searched = "--data, $CUMULUS_DATA, ./data/fashion-mnist, ../shared/data/fashion-mnist";
  // Checked before anything is created, so a machine without the tools is told what to install
  // and left as it was.
  for (const char* tool : {"curl", "sha256sum"})
    if (!on_path(tool))
      throw cumulus::Error(std::string("Fashion-MNIST not found (") + searched + ") and " + tool +
                           ", needed to download and verify it, is not installed (Debian: apt-get install " +
                           (std::string(tool) == "curl" ? "curl ca-certificates" : "coreutils") +
                           ", or scripts/install-deps.sh); or " + what_to_do(dir));
  std::vector<fs::path> created;
  std::error_code ec;
  for (const fs::path& d : {dir.parent_path(), dir})
    if (!fs::exists(d, ec)) created.push_back(d);
  fs::create_directories(dir, ec);
  if (ec) throw cumulus::Error("cannot create " + dir.string() + " for the download: " + ec.message());
  if (!quiet) std::fprintf(stderr, "Fashion-MNIST not found (%s); downloading into %s\n", searched.c_str(), dir.c_str());
  try {
    for (const FileInfo& f : kFiles)
      if (!fs::is_regular_file(dir / f.name)) download(dir, f, quiet);
  } catch (...) {
    clean_up(created);
    throw;
  }
  return dir.string();
}

}  // namespace

std::string locate_fashion_mnist(const std::string& data_flag, bool quiet) {
  const std::string dir = find_fashion_mnist(data_flag, quiet);
  check_split_headers(dir);
  return dir;
}

}  // namespace fmnist

// apps/gpt under hostile input (issue 55), one case per class: an output that is an input (by name,
// ./name, a symlink, a hard link), outputs on one path, a symlinked output; FIFOs and devices as
// inputs; a file-size limit; stale temporaries; forged metadata and tensors; a resume with other
// settings or counters; a finished run resumed; messages that name the flag or file; weights that
// nanoGPT's GPT loads strictly; and no file opened by an app but through the library.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "cumulus/io/file.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/models/gpt.h"
#include "test_util.h"

namespace cumulus {
namespace {

namespace fs = std::filesystem;
using testing::python_with_torch;
using testing::quote;
using testing::Result;
using testing::run_command;
using testing::TempDir;

// The command, stdout and stderr together; `timeout` ends a hang as exit 124.
Result gpt(const std::string& args, const std::string& prefix = "") {
  return run_command(prefix + "timeout 60 " + std::string(GPT_BIN) + " " + args + " 2>&1");
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string write_corpus(const TempDir& dir, const std::string& name = "corpus.txt", bool shuffled = false) {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    const bool question = (shuffled ? i + 1 : i) % 3 == 0;
    text += "To be, or not to be" + std::string(question ? ": that is the question.\n" : "; ay, there's the rub.\n");
  }
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

const std::string kTiny =
    " --context 16 --width 16 --layers 2 --micro-batch 4 --accum-steps 3 --warmup 1 --eval-windows 4"
    " --quiet";

std::string train_args(const std::string& corpus, int steps = 2, int heads = 2) {
  return "train --data " + quote(corpus) + kTiny + " --steps " + std::to_string(steps) + " --heads " +
         std::to_string(heads);
}

void expect_has(const Result& r, const std::string& text, const std::string& what) {
  EXPECT_NE(r.out.find(text), std::string::npos) << what << ": expected '" << text << "' in\n" << r.out;
}

bool has_temporary(const TempDir& dir) {
  for (const auto& e : fs::directory_iterator(dir.str()))
    if (e.path().filename().string().find(".cumulus-tmp.") != std::string::npos) return true;
  return false;
}

// A safetensors file rewritten with `edit` applied to its contents (a "checksum_crc32" in the
// metadata is recomputed on save: the forgery is consistent, as an attacker's would be).
void forge(const std::string& path, const std::function<void(io::SafetensorsContents&)>& edit) {
  io::SafetensorsContents c = io::load_safetensors(path);
  edit(c);
  io::save_safetensors(path, c.tensors, c.metadata);
}

// A finished 2-step run's weights (and state) in `dir`, and its corpus.
struct Trained {
  std::string corpus, weights;
};
Trained train_once(const TempDir& dir, const std::string& extra = "") {
  Trained t{write_corpus(dir), dir.file("w.st")};
  const Result r = gpt(train_args(t.corpus) + " --save " + t.weights + extra);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return t;
}

// ---- 1. outputs never replace inputs, nor each other, nor go through a link ----------------------

TEST(GptHostile, NoOutputReplacesTheCorpusByAnyName) {
  TempDir dir;
  const std::string corpus = write_corpus(dir), before = read(corpus);
  fs::create_symlink(corpus, dir.file("sym.txt"));
  fs::create_hard_link(corpus, dir.file("hard.txt"));
  for (const std::string flag : {"--save", "--metrics", "--memory-report", "--memory-plot", "--op-profile"})
    for (const std::string name : {corpus, std::string("./corpus.txt"), dir.file("sym.txt"), dir.file("hard.txt")}) {
      const Result r = gpt(train_args("corpus.txt") + " " + flag + " " + quote(name), "cd " + quote(dir.str()) + " && ");
      EXPECT_EQ(r.exit_code, 2) << flag << " " << name << "\n" << r.out;
      expect_has(r, flag, flag + " " + name);
    }
  EXPECT_TRUE(read(corpus) == before) << "the corpus was changed";
}

TEST(GptHostile, InitWeightsOutputsOnOnePathAndLinkedOutputsAreRefused) {
  TempDir dir;
  const Trained t = train_once(dir);
  const std::string weights_before = read(t.weights);
  Result r = gpt(train_args(t.corpus) + " --init " + t.weights + " --save " + t.weights);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "--init", "init over save");
  r = gpt(train_args(t.corpus) + " --metrics " + dir.file("x") + " --memory-report " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "same file", "two outputs");
  // A link to an unrelated file: refused up front, the file untouched.
  std::ofstream(dir.file("precious.txt")) << "keep me";
  fs::create_symlink(dir.file("precious.txt"), dir.file("link.st"));
  r = gpt(train_args(t.corpus) + " --save " + dir.file("link.st"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "symbolic link", "linked --save");
  EXPECT_EQ(read(dir.file("precious.txt")), "keep me");
  EXPECT_TRUE(read(t.weights) == weights_before);
}

// A link swapped in after the checks: the write replaces the link, never its target.
TEST(GptHostile, ALinkSwappedInIsReplacedNotWrittenThrough) {
  TempDir dir;
  std::ofstream(dir.file("precious.txt")) << "keep me";
  fs::create_symlink(dir.file("precious.txt"), dir.file("out.txt"));
  io::write_file_atomic(dir.file("out.txt"), "new", io::OutputLinks::replace);
  EXPECT_EQ(read(dir.file("precious.txt")), "keep me");
  EXPECT_FALSE(fs::is_symlink(dir.file("out.txt")));
  EXPECT_EQ(read(dir.file("out.txt")), "new");
}

TEST(GptHostile, AnUnwritableSaveIsRefusedBeforeTraining) {
  TempDir dir;
  const std::string corpus = write_corpus(dir);
  const Result r = gpt(train_args(corpus) + " --save " + dir.file("missing/w.st"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "--save", "missing folder");
  EXPECT_EQ(r.out.find("validation loss"), std::string::npos) << r.out;
}

// ---- 2. special and oversized inputs ----------------------------------------------------------

TEST(GptHostile, FifosAndDevicesAsInputsAreRefusedWithoutHanging) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  fs::create_directory(dir.file("data"));
  ASSERT_EQ(::mkfifo(dir.file("data/shakespeare.txt").c_str(), 0600), 0);
  for (const std::string data : {dir.file("fifo"), dir.file("data"), std::string("/dev/zero")}) {
    const Result r = gpt(train_args(data));
    EXPECT_EQ(r.exit_code, 2) << data << "\n" << r.out;
    expect_has(r, "not a regular file", data);
  }
  // The metrics a resume continues, as a FIFO.
  const Trained t = train_once(dir);
  const Result r = gpt(train_args(t.corpus, 4) + " --resume " + t.weights + " --metrics " + dir.file("fifo"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "--metrics", "metrics FIFO");
}

TEST(GptHostile, AFolderWithoutTheCorpusAndAnOversizedCorpusAreNamed) {
  TempDir dir;
  fs::create_directory(dir.file("empty"));
  Result r = gpt(train_args(dir.file("empty")));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "holds no shakespeare.txt", "folder without the corpus");
  {
    std::ofstream big(dir.file("big.txt"));
  }
  fs::resize_file(dir.file("big.txt"), (uint64_t{300} << 20));  // sparse: no disk used
  r = gpt(train_args(dir.file("big.txt")));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  expect_has(r, "at most 268435456 are read", "oversized corpus");
}

// ---- 3. a file-size limit, and a dead writer's temporary ------------------------------------------

TEST(GptHostile, AFileSizeLimitIsAnErrorNamingTheFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string corpus = write_corpus(dir);
  // The weights (about 30 kB) exceed the limit; the shell's ulimit is setrlimit(RLIMIT_FSIZE).
  const Result r = gpt(train_args(corpus) + " --save " + dir.file("w.st"), "ulimit -f 8 && ");
  EXPECT_EQ(r.exit_code, 1) << r.out;  // not 128 + SIGXFSZ
  expect_has(r, "--save", "size limit");
  expect_has(r, "File too large", "size limit");
  EXPECT_FALSE(has_temporary(dir)) << "a temporary was left";
}

TEST(GptHostile, ADeadWritersTemporaryIsRemoved) {
  TempDir dir;
  const std::string corpus = write_corpus(dir);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // its pid now names no process
  const std::string stale = io::temp_path_for(dir.file("w.st"), child, 0x12345678);
  std::ofstream(stale) << "half a file";
  const Result r = gpt(train_args(corpus) + " --save " + dir.file("w.st"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(fs::exists(stale));
}

// ---- 4. forged weights and checkpoints -----------------------------------------------------------

TEST(GptHostile, ForgedMetadataIsRefusedNamingTheFileAndTheKey) {
  TempDir dir;
  const Trained t = train_once(dir);
  struct Case {
    std::string key, value;
  };
  for (const Case& c : {Case{"gpt.n_embd", "1099511627776"}, Case{"gpt.n_layer", "abc"}, Case{"gpt.n_head", "-2"}}) {
    const std::string path = dir.file("forged.st");
    fs::copy_file(t.weights, path, fs::copy_options::overwrite_existing);
    forge(path, [&](io::SafetensorsContents& s) { s.metadata[c.key] = c.value; });
    const Result r = gpt("sample --load " + path + " --length 5");
    EXPECT_EQ(r.exit_code, 1) << c.key << "\n" << r.out;
    expect_has(r, path, c.key);
    expect_has(r, c.key, c.key);
  }
  // A config within range that its tensors do not match: refused before a model that size is made.
  forge(dir.file("forged.st"), [&](io::SafetensorsContents& s) {
    s.metadata = io::load_safetensors(t.weights).metadata;
    s.metadata["gpt.n_embd"] = "65536";
  });
  const Result wide = gpt("sample --load " + dir.file("forged.st") + " --length 5");
  EXPECT_EQ(wide.exit_code, 1) << wide.out;
  expect_has(wide, "this GPT's is [", "a config its tensors do not match");
  // The training state: a non-number, a negative counter, a position inside a step, a NaN moment.
  struct StateCase {
    std::function<void(io::SafetensorsContents&)> edit;
    std::string expected;
  };
  const std::vector<StateCase> state_cases = {
      {[](io::SafetensorsContents& s) { s.metadata["next_micro_batch"] = "abc"; }, "next_micro_batch"},
      {[](io::SafetensorsContents& s) { s.metadata["optimizer_steps"] = "-1"; }, "optimizer_steps"},
      {[](io::SafetensorsContents& s) { s.metadata["next_micro_batch"] = "4"; }, "inside a step"},
      {[](io::SafetensorsContents& s) {
         for (auto& [name, tensor] : s.tensors)
           if (name.rfind("optimizer.exp_avg_sq", 0) == 0) {
             std::vector<float> v = tensor.to_vector<float>();
             v[0] = -1.0f;
             tensor = Tensor::from_vector(v, tensor.shape());
           }
       },
       "never negative"},
      {[](io::SafetensorsContents& s) {
         for (auto& [name, tensor] : s.tensors)
           if (name.rfind("optimizer.exp_avg", 0) == 0) {
             std::vector<float> v = tensor.to_vector<float>();
             v[0] = std::numeric_limits<float>::quiet_NaN();
             tensor = Tensor::from_vector(v, tensor.shape());
           }
       },
       "non-finite"}};
  for (const StateCase& c : state_cases) {
    fs::copy_file(t.weights, dir.file("r.st"), fs::copy_options::overwrite_existing);
    fs::copy_file(t.weights + ".state", dir.file("r.st.state"), fs::copy_options::overwrite_existing);
    forge(dir.file("r.st.state"), c.edit);
    const Result r = gpt(train_args(t.corpus) + " --resume " + dir.file("r.st"));
    EXPECT_EQ(r.exit_code, 1) << c.expected << "\n" << r.out;
    expect_has(r, dir.file("r.st.state"), c.expected);
    expect_has(r, c.expected, c.expected);
  }
}

TEST(GptHostile, ForgedTensorsAreRefusedBeforeTheyAreUsed) {
  TempDir dir;
  const Trained t = train_once(dir);
  // An extra tensor, a NaN weight, a wrong shape.
  const std::string extra = dir.file("extra.st"), nan = dir.file("nan.st"), shape = dir.file("shape.st");
  for (const std::string& p : {extra, nan, shape}) fs::copy_file(t.weights, p);
  forge(extra, [](io::SafetensorsContents& s) { s.tensors.emplace_back("optimizer.exp_avg", Tensor::zeros({4})); });
  forge(nan, [](io::SafetensorsContents& s) {
    std::vector<float> v = s.tensors[0].second.to_vector<float>();
    v[1] = std::numeric_limits<float>::infinity();
    s.tensors[0].second = Tensor::from_vector(v, s.tensors[0].second.shape());
  });
  forge(shape, [](io::SafetensorsContents& s) { s.tensors[0].second = Tensor::zeros({3, 3}); });
  for (const std::string& p : {extra, nan, shape}) {
    const Result sampled = gpt("sample --load " + p + " --length 5");
    EXPECT_EQ(sampled.exit_code, 1) << p << "\n" << sampled.out;
    expect_has(sampled, p, "sample");
    const Result init = gpt(train_args(t.corpus) + " --init " + p);
    EXPECT_EQ(init.exit_code, 1) << p << "\n" << init.out;
    expect_has(init, p, "init");
  }
}

// Initial weights made for another GPT or another text: the heads (shapes alone cannot tell) and
// the vocabulary (token ids would mean other characters) are compared, each named.
TEST(GptHostile, InitWeightsOfAnotherGptOrTextAreRefused) {
  TempDir dir;
  const Trained t = train_once(dir);
  Result r = gpt(train_args(t.corpus, 2, /*heads=*/4) + " --init " + t.weights);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  expect_has(r, "gpt.n_head 2, this run's 4", "other heads");
  std::string other_text = read(t.corpus);
  std::replace(other_text.begin(), other_text.end(), 'q', 'Q');
  std::ofstream(dir.file("other.txt")) << other_text;
  r = gpt(train_args(dir.file("other.txt")) + " --init " + t.weights);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  expect_has(r, "its token ids would mean other characters", "other vocabulary");
  expect_has(r, t.weights, "other vocabulary");
  r = gpt(train_args(t.corpus) + " --init " + t.weights);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// ---- 5. resumes: other settings refused, each named; a finished run adds nothing -------------------

TEST(GptHostile, AResumeWithOtherSettingsOrDataIsRefusedNamingEach) {
  TempDir dir;
  const Trained t = train_once(dir, " --stop-after 1");
  Result r = gpt(train_args(t.corpus, 2, 4) + " --lr 0.01 --resume " + t.weights);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  expect_has(r, "--heads 2, this run has 4", "heads");
  expect_has(r, "--lr 0.001, this run has 0.01", "lr");
  const std::string other = write_corpus(dir, "other.txt", /*shuffled=*/true);
  r = gpt(train_args(other) + " --resume " + t.weights);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  expect_has(r, "--data", "other text");
  r = gpt(train_args(t.corpus) + " --resume " + t.weights + " --init " + t.weights);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  expect_has(r, "--init", "init with resume");
}

TEST(GptHostile, AFinishedRunResumedAddsNothing) {
  TempDir dir;
  const Trained t = train_once(dir, " --metrics " + dir.file("m.jsonl"));
  const std::string metrics = read(dir.file("m.jsonl")), weights = read(t.weights);
  const Result r =
      gpt(train_args(t.corpus) + " --resume " + t.weights + " --save " + t.weights + " --metrics " + dir.file("m.jsonl"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  expect_has(r, "nothing to do", "finished run");
  EXPECT_EQ(read(dir.file("m.jsonl")), metrics);
  EXPECT_TRUE(read(t.weights) == weights);
}

// ---- 6. messages -------------------------------------------------------------------------------

TEST(GptHostile, MessagesNameTheFlagOrTheCommand) {
  TempDir dir;
  const Trained t = train_once(dir);
  struct Case {
    std::string args, expected;
    int exit_code;
  };
  for (const Case& c : {Case{"fly", "'fly'", 2}, Case{"sample --load " + t.weights + " --temperature nan", "--temperature", 2},
                        Case{"sample --load " + t.weights + " --temperature 1e-300", "--temperature", 2},
                        Case{"sample --load " + t.weights + " --seed 9223372036854775808", "--seed", 2},
                        Case{train_args(t.corpus) + " --min-lr nan", "--min-lr", 2},
                        Case{"sample --load " + t.weights + " --prompt '#'", "--prompt", 2},
                        Case{train_args(t.corpus) + " --effective-batch 8 --memory-budget 0", "--memory-budget 0", 2}}) {
    const Result r = gpt(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.out;
    expect_has(r, c.expected, c.args);
  }
  // A corpus byte the resumed vocabulary lacks blames the data, not --context.
  std::ofstream(dir.file("odd.txt")) << read(t.corpus) << "#";
  const Result odd = gpt(train_args(dir.file("odd.txt"), 4) + " --resume " + t.weights);
  EXPECT_EQ(odd.exit_code, 1) << odd.out;
  expect_has(odd, dir.file("odd.txt"), "odd byte");
  EXPECT_EQ(odd.out.find("--context"), std::string::npos) << odd.out;
}

TEST(GptHostile, AFailedStandardOutputIsAnErrorAndNeverTakesAFile) {
  TempDir dir;
  const Trained t = train_once(dir);
  if (fs::exists("/dev/full")) {
    const Result full = run_command("timeout 60 " + std::string(GPT_BIN) + " sample --load " + t.weights +
                                    " --length 5 2>&1 >/dev/full");
    EXPECT_EQ(full.exit_code, 1) << full.out;
    expect_has(full, "standard output", "/dev/full");
  }
  // stdout closed: the metrics file must not take its number, and the failure is reported.
  const Result closed = run_command("timeout 60 " + std::string(GPT_BIN) + " " + train_args(t.corpus) +
                                    " --metrics " + dir.file("m.jsonl") + " 2>&1 >&-");
  EXPECT_EQ(closed.exit_code, 1) << closed.out;
  expect_has(closed, "standard output", "closed stdout");
  std::istringstream lines(read(dir.file("m.jsonl")));
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("{\"step\"", 0), 0u) << line;
}

// ---- 7. interop and the facility ----------------------------------------------------------------

TEST(GptHostile, TheLayoutIsTheModelsStateDict) {
  models::GPTConfig config;
  config.vocab_size = 7;
  config.block_size = 5;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 8;
  Generator gen(1);
  const models::GPT model(config, gen, Device::cpu());
  const io::NamedTensors state = model.state_dict();
  const std::vector<models::GPTTensorLayout> layout = models::gpt_state_layout(config);
  ASSERT_EQ(state.size(), layout.size());
  for (std::size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].first, layout[i].name);
    EXPECT_EQ(state[i].second.shape(), layout[i].shape) << layout[i].name;
  }
}

TEST(GptHostile, NanoGptLoadsTheSavedWeightsStrictly) {
  const std::string python = python_with_torch();
  const std::string twin = std::string(CUMULUS_SOURCE_DIR) + "/bench/pytorch";
  if (python.empty())
    GTEST_SKIP() << "no Python with torch and safetensors ($CUMULUS_TORCH_PYTHON, python3, /work/venv): the strict "
                    "load is not checked";
  TempDir dir;
  const Trained t = train_once(dir);
  const std::string script =
      "import sys; sys.path.insert(0, " + quote(twin) +
      "); from gpt import GPT; from safetensors import safe_open; from safetensors.torch import load_file\n"
      "m = safe_open(sys.argv[1], 'pt').metadata()\n"
      "c = {k: int(m['gpt.' + k]) for k in ('vocab_size', 'block_size', 'n_layer', 'n_head', 'n_embd')}\n"
      "GPT(c).load_state_dict(load_file(sys.argv[1]), strict=True); print('loaded strictly')\n";
  std::ofstream(dir.file("load.py")) << script;
  const Result r = run_command(quote(python) + " " + dir.file("load.py") + " " + t.weights + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  expect_has(r, "loaded strictly", "strict load");
}

// Every app's files go through the library (cumulus/io/file.h, cumulus/io/run_files.h): no source
// under apps/, the apps' common code included, opens a file for writing itself.
TEST(GptHostile, NoAppOpensAnOutputFileItself) {
  const std::regex opens_output(R"((\bfopen\s*\()|(\bofstream\b)|(\bstd::fstream\b)|((::|\s|\()open\s*\([^)]*O_(WRONLY|RDWR|CREAT)))");
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(std::string(CUMULUS_SOURCE_DIR) + "/apps")) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu")) continue;
    ++files;
    std::istringstream lines(read(e.path().string()));
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      ++n;
      const std::string code = line.rfind("#include", 0) == 0 ? "" : line.substr(0, line.find("//"));
      EXPECT_FALSE(std::regex_search(code, opens_output)) << e.path().string() << ":" << n << ": " << line;
    }
  }
  EXPECT_GT(files, 5);
}

}  // namespace
}  // namespace cumulus

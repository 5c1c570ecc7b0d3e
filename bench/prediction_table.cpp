// The prediction table of issue 16 (Note [Memory prediction] in engine/plan/prediction.cpp): for
// the seed MLP and the CNN on the CPU (or CUDA with --device cuda), every power of two from 1 to 4096, the predicted
// peak and reserved bytes of one training micro-batch against the measured ones. The prediction is made once per model,
// as the app's planner makes it (record_micro_batch at 128 and 256, the optimizer state as fixed blocks); each
// measurement runs one micro-batch (the batch in category data, forward, summed cross-entropy, backward into the flat
// gradients) from the state at rest with the optimizer state held, as the planner's verification does.
//
//   prediction_table OUT_DIR [--commit SHA] [--machine TEXT] [--state-copies N] [--max-size B] [--device cpu|cuda]
//
// writes OUT_DIR/prediction_table.json and OUT_DIR/prediction_table.md. A size is skipped (and
// the table says why) when its predicted peak exceeds 6 GiB of host memory or the previous size of
// the same model took more than 30 s (so this one would take about 60 s or more).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/loss.h"
#include "engine/plan/prediction.h"

namespace {

using namespace cumulus;

constexpr int64_t kMaxPeakBytes = int64_t{6} << 30;
constexpr double kMaxPreviousSeconds = 30.0;

struct Row {
  std::string model;
  int64_t micro_batch = 0;
  bool measured = false;
  std::string skipped;  // why, when not measured
  plan::PredictedMemory predicted;
  int64_t peak = 0, reserved = 0;
  double seconds = 0;
};

double pct(int64_t predicted, int64_t measured) {
  return 100.0 * static_cast<double>(predicted - measured) / static_cast<double>(measured);
}

std::string mib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(bytes) / (1 << 20));
  return s;
}

std::vector<Row> run_model(const std::string& name, int copies, int64_t max_size, Device device) {
  CachingAllocator& alloc = allocator_for(device);
  Generator gen(3);
  std::unique_ptr<nn::Model> model;
  if (name == "cnn") model = std::make_unique<models::CNN>(gen, device);
  else model = std::make_unique<models::SeedMLP>(gen, device);
  const nn::FlatParameters flat(*model);
  alloc.empty_cache();
  auto micro_batch = [&](int64_t b) {
    Tensor x, y;
    {
      MemoryCategoryScope scope(MemoryCategory::data);
      x = Tensor::zeros(Shape{b, 784}, DType::f32, device);
      y = Tensor::zeros(Shape{b}, DType::i32, device);
    }
    Tensor loss = model->loss(x, y, ops::Reduction::Sum);  // the app's path (the fused MLP on CUDA)
    loss.backward();
    loss = Tensor();
    flat.mark_gradients_stale();
  };
  const int64_t copy_bytes = static_cast<int64_t>(flat.values().allocated_bytes());
  const std::vector<plan::FixedBlock> state(static_cast<std::size_t>(copies),
                                            plan::FixedBlock{MemoryCategory::optimizer_state, copy_bytes});
  const auto t0 = std::chrono::steady_clock::now();
  const plan::MemoryPredictor p = plan::record_micro_batch(alloc, micro_batch, 128, 256, state);
  const double record_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!p.ok()) {
    std::fprintf(stderr, "%s: no prediction: %s\n", name.c_str(), p.reason().c_str());
    std::exit(1);
  }
  std::printf("%s: %s; recording took %.2f s\n", name.c_str(), p.reason().c_str(), record_s);

  std::vector<Row> rows;
  double previous_s = 0;
  for (int64_t b = 1; b <= max_size; b *= 2) {
    Row r;
    r.model = name;
    r.micro_batch = b;
    r.predicted = p.predict(b);
    if (r.predicted.peak_bytes > kMaxPeakBytes) {
      r.skipped = "predicted peak " + mib(r.predicted.peak_bytes) + " MiB exceeds the 6 GiB host-memory cap";
    } else if (previous_s > kMaxPreviousSeconds) {
      char why[128];
      std::snprintf(why, sizeof why, "the previous size took %.1f s (this one would take about twice)", previous_s);
      r.skipped = why;
    } else {
      {
        std::vector<Tensor> held;
        MemoryCategoryScope scope(MemoryCategory::optimizer_state);
        for (int c = 0; c < copies; ++c) held.push_back(Tensor::empty(Shape{copy_bytes / 4}, DType::f32, device));
        alloc.empty_cache();
        alloc.reset_peak();
        const auto t = std::chrono::steady_clock::now();
        micro_batch(b);
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        const MemoryStats st = alloc.stats();
        r.peak = st.allocated_peak;
        r.reserved = st.reserved_peak;
      }
      alloc.empty_cache();
      r.measured = true;
      previous_s = r.seconds;
    }
    if (r.measured)
      std::printf(
          "%s B=%lld: peak predicted %lld measured %lld (%+.3f%%), reserved predicted %lld measured %lld "
          "(%+.3f%%), %.2f s\n",
          name.c_str(), static_cast<long long>(b), static_cast<long long>(r.predicted.peak_bytes),
          static_cast<long long>(r.peak), pct(r.predicted.peak_bytes, r.peak),
          static_cast<long long>(r.predicted.reserved_bytes), static_cast<long long>(r.reserved),
          pct(r.predicted.reserved_bytes, r.reserved), r.seconds);
    else std::printf("%s B=%lld: skipped: %s\n", name.c_str(), static_cast<long long>(b), r.skipped.c_str());
    std::fflush(stdout);
    rows.push_back(r);
  }
  return rows;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// What a table was measured on.
struct Run {
  std::string date, machine, commit, device;
  int copies = 0;
};

void write_json(const std::string& path, const Run& run, const std::vector<Row>& rows) {
  const std::string& date = run.date;
  const std::string& machine = run.machine;
  const std::string& commit = run.commit;
  const int copies = run.copies;
  std::ostringstream js;
  js << "{\n  \"date\": \"" << date << "\",\n  \"machine\": \"" << json_escape(machine) << "\",\n  \"commit\": \""
     << json_escape(commit) << "\",\n  \"device\": \"" << run.device << "\",\n  \"recorded_at\": [128, 256],\n"
     << "  \"optimizer_state_copies\": " << copies << ",\n  \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << "    {\"model\": \"" << r.model << "\", \"micro_batch\": " << r.micro_batch
       << ", \"predicted_peak_bytes\": " << r.predicted.peak_bytes
       << ", \"predicted_reserved_bytes\": " << r.predicted.reserved_bytes;
    if (r.measured) {
      char e[96];
      std::snprintf(e, sizeof e, "%.4f, \"reserved_error_pct\": %.4f, \"seconds\": %.3f",
                    pct(r.predicted.peak_bytes, r.peak), pct(r.predicted.reserved_bytes, r.reserved), r.seconds);
      js << ", \"measured_peak_bytes\": " << r.peak << ", \"measured_reserved_bytes\": " << r.reserved
         << ", \"peak_error_pct\": " << e;
    } else {
      js << ", \"skipped\": \"" << json_escape(r.skipped) << "\"";
    }
    js << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  std::ofstream(path) << js.str();
}

void write_markdown(const std::string& path, const Run& run, const std::vector<Row>& rows) {
  const std::string& date = run.date;
  const std::string& machine = run.machine;
  const std::string& commit = run.commit;
  const int copies = run.copies;
  std::ostringstream md;
  md << "Date " << date << ", machine: " << machine << ", commit " << commit << ". Device " << run.device
     << ". Prediction recorded at micro-batches 128 and 256 (plus the halvings of 128 and the "
        "refinement sizes); optimizer state: "
     << copies << " copies of the parameters held.\n\n";
  md << "| model | micro-batch | predicted peak (MiB) | measured peak (MiB) | peak error % | predicted reserved "
        "(bytes) | measured reserved (bytes) | reserved error % | time (s) |\n";
  md << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : rows) {
    char line[512];
    if (r.measured)
      std::snprintf(line, sizeof line, "| %s | %lld | %s | %s | %+.3f | %lld | %lld | %+.3f | %.2f |\n",
                    r.model.c_str(), static_cast<long long>(r.micro_batch), mib(r.predicted.peak_bytes).c_str(),
                    mib(r.peak).c_str(), pct(r.predicted.peak_bytes, r.peak),
                    static_cast<long long>(r.predicted.reserved_bytes), static_cast<long long>(r.reserved),
                    pct(r.predicted.reserved_bytes, r.reserved), r.seconds);
    else
      std::snprintf(line, sizeof line, "| %s | %lld | %s | skipped: %s | | %lld | | | |\n", r.model.c_str(),
                    static_cast<long long>(r.micro_batch), mib(r.predicted.peak_bytes).c_str(), r.skipped.c_str(),
                    static_cast<long long>(r.predicted.reserved_bytes));
    md << line;
  }
  std::ofstream(path) << md.str();
}

}  // namespace

int main(int argc, char** argv) {
  const bool help = argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
  if (argc < 2 || help) {
    std::fprintf(help ? stdout : stderr,
                 "usage: %s OUT_DIR [--commit SHA] [--machine TEXT] [--state-copies N] [--max-size B] "
                 "[--device cpu|cuda]\n",
                 argv[0]);
    return help ? 0 : 2;
  }
  const std::string out_dir = argv[1];
  std::string commit = "unknown", machine = "CPU";
  int copies = 2;  // AdamW's two moments: the most state the app's planner holds
  int64_t max_size = 4096;
  std::string device_name = "cpu";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--commit") commit = v;
    else if (k == "--machine") machine = v;
    else if (k == "--state-copies") copies = std::atoi(v.c_str());
    else if (k == "--max-size") max_size = std::atoll(v.c_str());
    else if (k == "--device") device_name = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));

  Device device;
  try {
    device = Device::parse(device_name);
    check_device_available(device);
  } catch (const Error& e) {
    std::fprintf(stderr, "--device %s: %s\n", device_name.c_str(), e.what());
    return 2;
  }
  std::vector<Row> rows;
  for (const std::string name : {"mlp", "cnn"})
    for (Row& r : run_model(name, copies, max_size, device)) rows.push_back(std::move(r));

  const Run run{date, machine, commit, device.str(), copies};
  write_json(out_dir + "/prediction_table.json", run, rows);
  write_markdown(out_dir + "/prediction_table.md", run, rows);
  return 0;
}

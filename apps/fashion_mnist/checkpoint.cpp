#include "checkpoint.h"

#include <cstring>
#include <map>
#include <set>

#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"

namespace fmnist {

using cumulus::Tensor;
namespace io = cumulus::io;

namespace {

constexpr const char* kFormat = "cumulus-checkpoint-1";
// Named in the metadata, it makes save_safetensors store a CRC-32 of the file's header and data,
// and load_safetensors verify it (Note [Checksum] in engine/io/safetensors.cpp). Checkpoints must
// carry one: a flipped bit or a partial copy is then an error, never a silently different resume.
constexpr const char* kChecksumKey = "checksum_crc32";
constexpr const char* kOptimizerPrefix = "optimizer.";

// The settings that must agree for a resume to be exact, as strings for the metadata.
std::map<std::string, std::string> run_config(const Options& o) {
  std::string schedule;
  for (const auto& [e, s] : o.schedule) schedule += (schedule.empty() ? "" : ",") + std::to_string(e) + ":" + std::to_string(s);
  return {{"model", o.model},
          {"optimizer", o.optimizer},
          {"micro_batch_size", std::to_string(o.batch_size)},
          {"accum_steps", schedule.empty() ? std::to_string(o.accum_steps) : schedule},
          {"normalize", o.normalize},
          {"shuffle", o.shuffle ? "true" : "false"},
          {"seed", std::to_string(o.seed)},
          {"train_limit", std::to_string(o.train_limit)}};
}

void copy_into_model(const std::string& path, const cumulus::nn::Module& model, const io::NamedTensors& tensors,
                     bool allow_extra_prefix) {
  std::map<std::string, Tensor> by_name(tensors.begin(), tensors.end());
  std::set<std::string> used;
  // The state dict: parameters and buffers (batch norm's running statistics and counter).
  for (const auto& [name, param] : model.state_dict()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw cumulus::Error(path + ": no tensor '" + name + "' (in the model's state dict)");
    const Tensor& t = it->second;
    if (t.dtype() != param.dtype() || t.shape() != param.shape())
      throw cumulus::Error(path + ": tensor '" + name + "' is " + t.shape().str() + " " + cumulus::dtype_name(t.dtype()) +
                           ", the model's is " + param.shape().str() + " " + cumulus::dtype_name(param.dtype()));
    Tensor target = param;
    target.copy_from(t);
    used.insert(name);
  }
  for (const auto& [name, t] : tensors) {
    if (used.count(name) || (allow_extra_prefix && name.rfind(kOptimizerPrefix, 0) == 0)) continue;
    throw cumulus::Error(path + ": tensor '" + name + "' is not in this model's state dict");
  }
}

int64_t get_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  if (it == meta.end()) throw cumulus::Error(path + ": checkpoint metadata lacks '" + key + "'");
  try {
    std::size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw cumulus::Error(path + ": checkpoint metadata '" + key + "' is not an integer: '" + it->second + "'");
  }
}

}  // namespace

void save_weights(const std::string& path, const cumulus::nn::Module& model) {
  io::save_safetensors(path, model.state_dict(), {{"format", "pt"}});
}

void load_weights(const std::string& path, const cumulus::nn::Module& model) {
  copy_into_model(path, model, io::load_safetensors(path).tensors, false);
}

void save_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                     const cumulus::optim::Optimizer& optimizer, const TrainingState& s, const Options& options) {
  io::NamedTensors tensors = model.state_dict();
  for (const auto& [name, t] : optimizer.state()) tensors.emplace_back(kOptimizerPrefix + name, t);
  std::map<std::string, std::string> meta = run_config(options);
  meta["format"] = kFormat;
  meta["epoch"] = std::to_string(s.epoch);
  meta["next_micro_batch"] = std::to_string(s.next_micro_batch);
  meta["micro_batches_total"] = std::to_string(s.counters.micro_batches_total);
  meta["optimizer_steps"] = std::to_string(s.counters.optimizer_steps);
  meta["skipped_steps"] = std::to_string(s.counters.skipped_steps);
  meta["optimizer_updates"] = std::to_string(s.optimizer_updates);
  // The running loss as its exact bit pattern, so a resumed epoch reports the same train_loss.
  uint64_t bits = 0;
  static_assert(sizeof bits == sizeof s.epoch_loss_sum);
  std::memcpy(&bits, &s.epoch_loss_sum, sizeof bits);
  meta["epoch_loss_sum_bits"] = std::to_string(static_cast<int64_t>(bits));  // read back by get_int
  meta["epoch_samples"] = std::to_string(s.epoch_samples);
  // RNG state: the initialization is replaced by the saved weights, and the shuffle order of an
  // epoch is a pure function of (seed, epoch), both recorded here.
  meta[kChecksumKey] = "";  // computed by save_safetensors
  io::save_safetensors(path, tensors, meta);
}

TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                              cumulus::optim::Optimizer& optimizer, const Options& options) {
  io::SafetensorsContents c;
  try {
    c = io::load_safetensors(path);  // verifies the checksum when the file has one
  } catch (const cumulus::Error& e) {
    throw cumulus::Error("checkpoint '" + path + "' cannot be used: " + e.what());
  }
  auto format = c.metadata.find("format");
  if (format == c.metadata.end() || format->second != kFormat)
    throw cumulus::Error(path + ": not a cumulus checkpoint (metadata 'format' is not " + std::string(kFormat) +
                         "); to start from plain weights use --init");
  if (c.metadata.count(kChecksumKey) == 0)
    throw cumulus::Error("checkpoint '" + path + "' is corrupt: its metadata has no '" + kChecksumKey +
                         "' (cumulus checkpoints store one; this file is damaged or older than that), so it "
                         "cannot be verified");
  for (const auto& [key, value] : run_config(options)) {
    auto it = c.metadata.find(key);
    const std::string saved = it == c.metadata.end() ? "(none)" : it->second;
    if (saved != value)
      throw UsageFailure("--resume '" + path + "' was made with " + key + " " + saved + ", this run has " + value +
                         "; resume with the same settings");
  }
  copy_into_model(path, model, c.tensors, true);
  cumulus::io::NamedTensors state;
  for (const auto& [name, t] : c.tensors)
    if (name.rfind(kOptimizerPrefix, 0) == 0) state.emplace_back(name.substr(std::string(kOptimizerPrefix).size()), t);
  TrainingState s;
  s.epoch = static_cast<int>(get_int(c.metadata, "epoch", path));
  s.next_micro_batch = get_int(c.metadata, "next_micro_batch", path);
  s.counters.epoch = s.epoch;
  s.counters.micro_batch_index = s.next_micro_batch;
  s.counters.micro_batches_total = get_int(c.metadata, "micro_batches_total", path);
  s.counters.optimizer_steps = get_int(c.metadata, "optimizer_steps", path);
  s.counters.skipped_steps = get_int(c.metadata, "skipped_steps", path);
  s.optimizer_updates = get_int(c.metadata, "optimizer_updates", path);
  const uint64_t bits = static_cast<uint64_t>(get_int(c.metadata, "epoch_loss_sum_bits", path));
  std::memcpy(&s.epoch_loss_sum, &bits, sizeof bits);
  s.epoch_samples = get_int(c.metadata, "epoch_samples", path);
  optimizer.load_state(state, s.optimizer_updates);
  return s;
}

}  // namespace fmnist

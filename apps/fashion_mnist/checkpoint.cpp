#include "checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"
#include "settings.h"

namespace fmnist {

using cumulus::Tensor;
namespace io = cumulus::io;

namespace {

constexpr const char* kFormat = "cumulus-checkpoint-2";
constexpr const char* kFormatPrefix = "cumulus-checkpoint-";
// Named in the metadata, it makes save_safetensors store a CRC-32 of the file's header and data,
// and load_safetensors verify it (Note [Checksum] in engine/io/safetensors.cpp). Checkpoints must
// carry one: a flipped bit or a partial copy is then an error, never a silently different resume.
constexpr const char* kChecksumKey = "checksum_crc32";
constexpr const char* kOptimizerPrefix = "optimizer.";

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

void save_weights(const std::string& path, const cumulus::nn::Module& model) { io::save_state_dict(path, model); }

void load_weights(const std::string& path, const cumulus::nn::Module& model) {
  const io::SafetensorsHeader header = io::read_safetensors_header(path);
  auto format = header.metadata.find("format");
  if (format != header.metadata.end() && format->second.rfind(kFormatPrefix, 0) == 0)
    throw UsageFailure("--init '" + path +
                       "' is a cumulus checkpoint (weights, optimizer state and counters): "
                       "continue its run with --resume");
  io::LoadStateDictOptions load_options;
  load_options.require_finite = true;  // training from NaN or Inf produces only non-finite losses
  io::load_state_dict(path, model, load_options);
}

void save_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                     const cumulus::optim::Optimizer& optimizer, const TrainingState& s, const RunConfig& options) {
  std::map<std::string, std::string> meta;
  for (const SettingValue& setting : settings_for(kCheckpoint, {options, ""}))
    meta["setting." + std::string(setting.row->key)] = setting.value;
  meta["format"] = kFormat;
  meta["epoch"] = std::to_string(s.epoch);
  meta["next_micro_batch"] = std::to_string(s.next_micro_batch);
  meta["micro_batches_total"] = std::to_string(s.counters.micro_batches_total);
  meta["optimizer_steps"] = std::to_string(s.counters.optimizer_steps);
  meta["skipped_steps"] = std::to_string(s.counters.skipped_steps);
  meta["optimizer_updates"] = std::to_string(s.optimizer_updates);
  // fp16's loss scale (a power of two, as its bit pattern) and its count of clean steps.
  uint32_t scale_bits = 0;
  static_assert(sizeof scale_bits == sizeof s.counters.loss_scale);
  std::memcpy(&scale_bits, &s.counters.loss_scale, sizeof scale_bits);
  meta["loss_scale_bits"] = std::to_string(scale_bits);
  meta["loss_scale_clean_steps"] = std::to_string(s.counters.loss_scale_clean_steps);
  // The last step's learning rate (its bit pattern): reported by a resumed run before its first step.
  uint32_t lr_bits = 0;
  std::memcpy(&lr_bits, &s.counters.last_lr, sizeof lr_bits);
  meta["last_lr_bits"] = std::to_string(lr_bits);
  // The running loss as its exact bit pattern, so a resumed epoch reports the same train_loss.
  uint64_t bits = 0;
  static_assert(sizeof bits == sizeof s.epoch_loss_sum);
  std::memcpy(&bits, &s.epoch_loss_sum, sizeof bits);
  meta["epoch_loss_sum_bits"] = std::to_string(static_cast<int64_t>(bits));  // read back by get_int
  meta["epoch_samples"] = std::to_string(s.epoch_samples);
  // RNG state: the initialization is replaced by the saved weights, and the shuffle order of an
  // epoch is a pure function of (seed, epoch), both recorded here.
  meta[kChecksumKey] = "";  // computed by save_safetensors
  io::save_state_dict(path, model, meta, io::ExtraTensors{kOptimizerPrefix, optimizer.state()});
}

TrainingState load_checkpoint(const std::string& path, const cumulus::nn::Module& model,
                              cumulus::optim::Optimizer& optimizer, const RunConfig& options,
                              const ResumeLimits& limits) {
  // The header first (no tensor data is read): is it a checkpoint of this run's settings? Then the
  // whole file, its names and shapes checked against the model before any tensor is allocated, its
  // checksum verified; the counters are read from the verified metadata.
  io::SafetensorsHeader header;
  try {
    header = io::read_safetensors_header(path);
  } catch (const cumulus::Error& e) {
    throw cumulus::Error("checkpoint '" + path + "' cannot be used: " + e.what());
  }
  auto format = header.metadata.find("format");
  if (format == header.metadata.end() || format->second.rfind(kFormatPrefix, 0) != 0)
    throw cumulus::Error(path + ": not a cumulus checkpoint (its metadata 'format' is not " + std::string(kFormat) +
                         "); to start from plain weights use --init");
  if (format->second != kFormat)
    throw cumulus::Error(path + ": a checkpoint in the older format '" + cumulus::excerpt(format->second) +
                         "', which does not record every setting that changes the result, so it cannot be resumed "
                         "exactly by this version (" +
                         kFormat + ")");
  if (header.metadata.count(kChecksumKey) == 0)
    throw cumulus::Error("checkpoint '" + path + "' is corrupt: its metadata has no '" + kChecksumKey +
                         "' (cumulus checkpoints store one; this file is damaged or older than that), so it "
                         "cannot be verified");
  TrainingState s;
  for (const SettingValue& setting : settings_for(kCheckpoint, {options, ""})) {
    const SettingRow& row = *setting.row;
    auto it = header.metadata.find("setting." + std::string(row.key));
    const std::string saved = it != header.metadata.end() ? cumulus::excerpt(it->second)
                              : row.before_recorded != nullptr ? row.before_recorded
                                                               : "(not recorded)";
    if (saved == setting.value) continue;
    const std::string name = row.name;
    if (row.overridable && options.overrides.count(name) == 1 && it != header.metadata.end()) {
      s.overridden.push_back(name + " " + saved + " -> " + setting.value);
      continue;
    }
    const char* unit = name == "accum-steps" ? " (micro-batches per step, all ranks together)" : "";
    throw UsageFailure("--resume '" + path + "' was made with --" + name + " " + saved + ", this run has " +
                       setting.value + unit + "; resume with the same value" +
                       (row.overridable ? " or allow the change with --override " + name : ""));
  }
  io::LoadStateDictOptions load_options;
  load_options.extra_prefix = kOptimizerPrefix;
  load_options.require_finite = true;  // weights and optimizer state (a NaN moment skips every step)
  load_options.extra_layout.emplace();
  for (const auto& t : optimizer.state_layout()) load_options.extra_layout->push_back({t.name, t.dtype, t.shape});
  io::LoadedStateDict loaded;
  try {
    loaded = io::load_state_dict(path, model, load_options);
  } catch (const cumulus::Error& e) {
    throw cumulus::Error("checkpoint '" + path + "' cannot be used: " + e.what());
  }
  const std::map<std::string, std::string>& meta = loaded.metadata;  // verified by the checksum
  // Counters, validated before the optimizer and the accumulator are restored: a damaged or forged
  // value must name the file, not surface later as an accumulator error or a silently different run.
  auto counter = [&](const char* key, int64_t lo, int64_t hi) {
    const int64_t v = get_int(meta, key, path);
    if (v < lo || v > hi)
      throw cumulus::Error("checkpoint '" + path + "': '" + key + "' is " + std::to_string(v) + ", outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  s.epoch = static_cast<int>(counter("epoch", 0, std::numeric_limits<int>::max()));
  if (s.epoch > options.epochs)
    throw UsageFailure("--resume '" + path + "' is at the end of epoch " + std::to_string(s.epoch) +
                       ", past --epochs " + std::to_string(options.epochs) + "; give --epochs " +
                       std::to_string(s.epoch) + " or more (--epochs counts all epochs, not the ones still to run)");
  s.next_micro_batch = get_int(meta, "next_micro_batch", path);
  // At the epoch's end (== micro-batches) the epoch's test pass is still to run: it was interrupted.
  if (s.next_micro_batch < 0 || s.next_micro_batch > limits.micro_batches_per_epoch)
    throw cumulus::Error("checkpoint '" + path + "' continues at micro-batch " + std::to_string(s.next_micro_batch) +
                         " of epoch " + std::to_string(s.epoch + 1) + ", but an epoch of this data has " +
                         std::to_string(limits.micro_batches_per_epoch) +
                         " micro-batches: was it made with other data (--data, --train-limit)?");
  s.counters.epoch = s.epoch;
  s.counters.micro_batch_index = s.next_micro_batch;
  s.counters.micro_batches_total = counter("micro_batches_total", 0, kMax);
  s.counters.optimizer_steps = counter("optimizer_steps", 0, kMax);
  s.counters.skipped_steps = counter("skipped_steps", 0, s.counters.optimizer_steps);
  s.optimizer_updates = counter("optimizer_updates", 0, s.counters.optimizer_steps);
  if (meta.count("loss_scale_bits") == 1) {  // absent from checkpoints older than --precision: fp32, unscaled
    const auto scale_bits = static_cast<uint32_t>(counter("loss_scale_bits", 0, 0xFFFFFFFFLL));
    std::memcpy(&s.counters.loss_scale, &scale_bits, sizeof scale_bits);
    if (!std::isfinite(s.counters.loss_scale) || s.counters.loss_scale <= 0.0f)
      throw cumulus::Error("checkpoint '" + path + "': 'loss_scale_bits' gives the loss scale " +
                           std::to_string(s.counters.loss_scale) + "; a loss scale is a positive finite number");
    s.counters.loss_scale_clean_steps =
        static_cast<int32_t>(counter("loss_scale_clean_steps", 0, std::numeric_limits<int32_t>::max()));
  }
  if (meta.count("last_lr_bits") == 1) {  // absent from older checkpoints: reported as 0 until the first step
    const auto lr_bits = static_cast<uint32_t>(counter("last_lr_bits", 0, 0xFFFFFFFFLL));
    std::memcpy(&s.counters.last_lr, &lr_bits, sizeof lr_bits);
    if (!std::isfinite(s.counters.last_lr) || s.counters.last_lr < 0.0f)
      throw cumulus::Error("checkpoint '" + path + "': 'last_lr_bits' gives the learning rate " +
                           std::to_string(s.counters.last_lr) + "; a learning rate is a finite number >= 0");
  }
  const uint64_t bits = static_cast<uint64_t>(get_int(meta, "epoch_loss_sum_bits", path));
  std::memcpy(&s.epoch_loss_sum, &bits, sizeof bits);
  s.epoch_samples = counter("epoch_samples", 0, limits.train_samples);

  try {
    optimizer.load_state(loaded.extra, s.optimizer_updates);
  } catch (const cumulus::Error& e) {
    throw cumulus::Error("checkpoint '" + path + "': its optimizer state does not fit this run: " + e.what());
  }
  return s;
}

}  // namespace fmnist

#include "cumulus/train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"

namespace cumulus::train {

using optim::LRSchedule;
using optim::Optimizer;
using optim::UpdateScalars;
namespace {

constexpr const char* kFormat = "cumulus-checkpoint-2";
constexpr const char* kFormatPrefix = "cumulus-checkpoint-";
// Named in the metadata, it makes save_safetensors store a CRC-32 of the file's header and data,
// and load_safetensors verify it (Note [Checksum] in engine/io/safetensors.cpp).
constexpr const char* kChecksumKey = "checksum_crc32";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kSettingPrefix = "setting.";

// Floats are stored as their bit patterns, so a resumed run continues with exactly the same values.
template <class Bits, class Float>
Bits bits_of(Float value) {
  static_assert(sizeof(Bits) == sizeof(Float));
  Bits bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
template <class Float, class Bits>
Float float_of(Bits bits) {
  Float value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

int64_t get_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  if (it == meta.end()) throw Error(path + ": checkpoint metadata lacks '" + key + "'");
  try {
    std::size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw Error(path + ": checkpoint metadata '" + key + "' is not an integer: '" + it->second + "'");
  }
}

// The header (no tensor data read): a checkpoint of this format, with a checksum, of these settings?
std::vector<std::string> check_header(const std::string& path, const ResumeOptions& options) {
  io::SafetensorsHeader header;
  try {
    header = io::read_safetensors_header(path);
  } catch (const Error& e) {
    throw Error("checkpoint '" + path + "' cannot be used: " + e.what());
  }
  const auto& meta = header.metadata;
  auto format = meta.find("format");
  if (format == meta.end() || format->second.rfind(kFormatPrefix, 0) != 0)
    throw Error(path + ": not a cumulus checkpoint (its metadata 'format' is not " + std::string(kFormat) + "); " +
                options.plain_weights_hint);
  if (format->second != kFormat)
    throw Error(path + ": a checkpoint in the older format '" + excerpt(format->second) +
                "', which does not record every setting that changes the result, so it cannot be resumed exactly "
                "by this version (" +
                kFormat + ")");
  if (meta.count(kChecksumKey) == 0)
    throw Error("checkpoint '" + path + "' is corrupt: its metadata has no '" + kChecksumKey +
                "' (cumulus checkpoints store one; this file is damaged or older than that), so it cannot be "
                "verified");
  std::vector<std::string> overridden;
  std::vector<const RecordedSetting*> differing;
  std::vector<std::string> saved_values;
  for (const RecordedSetting& setting : options.settings) {
    auto it = meta.find(kSettingPrefix + setting.key);
    const std::string saved = it != meta.end()          ? excerpt(it->second)
                              : setting.before_recorded ? *setting.before_recorded
                                                        : "(not recorded)";
    if (saved == setting.value) continue;
    if (setting.overridable && options.overrides.count(setting.name) == 1 && it != meta.end()) {
      overridden.push_back(setting.name + " " + saved + " -> " + setting.value);
      continue;
    }
    differing.push_back(&setting);
    saved_values.push_back(saved);
  }
  if (differing.empty()) return overridden;
  std::string message = "--resume '" + path + "' was made with ";
  for (std::size_t i = 0; i < differing.size(); ++i)
    message += (i == 0 ? "--" : "; with --") + differing[i]->name + " " + saved_values[i] + ", this run has " +
               differing[i]->value + differing[i]->unit;
  const bool one = differing.size() == 1;
  message += one ? "; resume with the same value" : "; resume with the same values";
  if (one && differing[0]->overridable) message += " or allow the change with --override " + differing[0]->name;
  throw SettingMismatch(message);
}

// The counters, validated before the optimizer and the Trainer are restored: a damaged or forged
// value must name the file, not surface later as an accumulator error or a silently different run.
CheckpointState read_state(const std::string& path, const std::map<std::string, std::string>& meta,
                           const ResumeOptions& options) {
  auto counter = [&](const char* key, int64_t lo, int64_t hi) {
    const int64_t v = get_int(meta, key, path);
    if (v < lo || v > hi)
      throw Error("checkpoint '" + path + "': '" + key + "' is " + std::to_string(v) + ", outside [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  CheckpointState s;
  TrainingCounters& c = s.counters;
  c.epoch = static_cast<int>(counter("epoch", 0, std::numeric_limits<int>::max()));
  c.micro_batch_index = get_int(meta, "next_micro_batch", path);
  if (c.micro_batch_index < 0 || c.micro_batch_index > options.micro_batches_per_epoch)
    throw Error("checkpoint '" + path + "' continues at micro-batch " + std::to_string(c.micro_batch_index) +
                " of epoch " + std::to_string(c.epoch + 1) + ", but an epoch of this data has " +
                std::to_string(options.micro_batches_per_epoch) + " micro-batches: " + options.other_data_hint);
  const int64_t group = options.micro_batches_per_group;
  if (group > 0 && c.micro_batch_index % group != 0)
    throw Error("checkpoint '" + path + "' continues at micro-batch " + std::to_string(c.micro_batch_index) +
                ", inside a step of " + std::to_string(group) +
                " micro-batches; checkpoints are written between steps: damaged or forged");
  c.micro_batches_total = counter("micro_batches_total", 0, kMax);
  c.optimizer_steps = counter("optimizer_steps", 0, kMax);
  // Steps skipped for a non-finite gradient are not among the steps taken (TrainingPosition::attempted_steps).
  c.skipped_steps = counter("skipped_steps", 0, kMax - c.optimizer_steps);
  s.optimizer_updates = counter("optimizer_updates", 0, c.optimizer_steps);
  if (meta.count("loss_scale_bits") == 1) {  // absent from checkpoints older than loss scaling: unscaled
    c.loss_scale = float_of<float>(static_cast<uint32_t>(counter("loss_scale_bits", 0, 0xFFFFFFFFLL)));
    if (!std::isfinite(c.loss_scale) || c.loss_scale <= 0.0f)
      throw Error("checkpoint '" + path + "': 'loss_scale_bits' gives the loss scale " + std::to_string(c.loss_scale) +
                  "; a loss scale is a positive finite number");
    c.loss_scale_clean_steps =
        static_cast<int32_t>(counter("loss_scale_clean_steps", 0, std::numeric_limits<int32_t>::max()));
  }
  if (meta.count("last_lr_bits") == 1) {  // absent from older checkpoints: 0 until the first step
    c.last_lr = float_of<float>(static_cast<uint32_t>(counter("last_lr_bits", 0, 0xFFFFFFFFLL)));
    if (!std::isfinite(c.last_lr) || c.last_lr < 0.0f)
      throw Error("checkpoint '" + path + "': 'last_lr_bits' gives the learning rate " + std::to_string(c.last_lr) +
                  "; a learning rate is a finite number >= 0");
  }
  if (meta.count("accum_steps_override") == 1)  // written only where Trainer::set_accum_steps was called
    c.accum_steps_override = static_cast<int>(counter("accum_steps_override", 0, std::numeric_limits<int>::max()));
  s.epoch_loss_sum = float_of<double>(static_cast<uint64_t>(get_int(meta, "epoch_loss_sum_bits", path)));
  if (!std::isfinite(s.epoch_loss_sum))
    throw Error("checkpoint '" + path + "': 'epoch_loss_sum_bits' gives the loss sum " +
                std::to_string(s.epoch_loss_sum) + "; a loss sum is a finite number");
  s.epoch_units = counter("epoch_samples", 0, options.units_per_epoch);
  return s;
}

// A second moment (Adam's running mean of squared gradients, "exp_avg_sq") is never negative: a
// negative one makes its update's square root NaN, so such a file is damaged or forged.
void check_second_moments(const std::string& path, const io::NamedTensors& optimizer_state) {
  for (const auto& [name, t] : optimizer_state) {
    if (name.find("exp_avg_sq") == std::string::npos || t.dtype() != DType::f32) continue;
    const std::vector<float> values = t.to_vector<float>();
    for (std::size_t i = 0; i < values.size(); ++i)
      if (values[i] < 0.0f)
        throw Error("checkpoint '" + path + "': optimizer tensor '" + name + "' holds " + std::to_string(values[i]) +
                    " at index " + std::to_string(i) + "; second moments are never negative: damaged or forged");
  }
}

}  // namespace

std::string setting_text(float value) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(value));
    if (std::strtof(buf, nullptr) == value) break;
  }
  return buf;
}

void save_training_checkpoint(const std::string& path, const nn::Module& model, const Optimizer& optimizer,
                              const CheckpointState& s, const std::vector<RecordedSetting>& settings,
                              const std::map<std::string, std::string>& metadata, io::OutputLinks links) {
  CUMULUS_CHECK(optimizer.shard_count() == optimizer.parameters().size(), InvalidArgument,
                "save_training_checkpoint: the optimizer keeps one shard of the state (ZeRO); save "
                "Trainer::optimizer_state(), gathered from every rank");
  save_training_checkpoint(path, model, optimizer.state(), s, settings, metadata, links);
}

void save_training_checkpoint(const std::string& path, const nn::Module& model,
                              const std::vector<std::pair<std::string, Tensor>>& optimizer_state,
                              const CheckpointState& s, const std::vector<RecordedSetting>& settings,
                              const std::map<std::string, std::string>& metadata, io::OutputLinks links) {
  std::map<std::string, std::string> meta = metadata;
  for (const RecordedSetting& setting : settings) meta[kSettingPrefix + setting.key] = setting.value;
  const TrainingCounters& c = s.counters;
  meta["format"] = kFormat;
  meta["epoch"] = std::to_string(c.epoch);
  meta["next_micro_batch"] = std::to_string(c.micro_batch_index);
  meta["micro_batches_total"] = std::to_string(c.micro_batches_total);
  meta["optimizer_steps"] = std::to_string(c.optimizer_steps);
  meta["skipped_steps"] = std::to_string(c.skipped_steps);
  meta["optimizer_updates"] = std::to_string(s.optimizer_updates);
  meta["loss_scale_bits"] = std::to_string(bits_of<uint32_t>(c.loss_scale));
  meta["loss_scale_clean_steps"] = std::to_string(c.loss_scale_clean_steps);
  meta["last_lr_bits"] = std::to_string(bits_of<uint32_t>(c.last_lr));
  if (c.accum_steps_override != 0) meta["accum_steps_override"] = std::to_string(c.accum_steps_override);
  // Read back by get_int, as a signed integer.
  meta["epoch_loss_sum_bits"] = std::to_string(static_cast<int64_t>(bits_of<uint64_t>(s.epoch_loss_sum)));
  meta["epoch_samples"] = std::to_string(s.epoch_units);
  meta[kChecksumKey] = "";  // computed by save_safetensors
  io::save_state_dict(path, model, meta, io::ExtraTensors{kOptimizerPrefix, optimizer_state}, links);
}

ResumedCheckpoint load_training_checkpoint(const std::string& path, const nn::Module& model, Optimizer& optimizer,
                                           const ResumeOptions& options) {
  ResumedCheckpoint r;
  r.overridden = check_header(path, options);
  // The whole file: names and shapes checked against the model and the optimizer before any tensor
  // is allocated, the checksum verified.
  io::LoadStateDictOptions load_options;
  load_options.extra_prefix = kOptimizerPrefix;
  load_options.require_finite = true;  // weights and optimizer state (a NaN moment skips every step)
  load_options.extra_layout.emplace();
  for (const auto& t : optimizer.state_layout()) load_options.extra_layout->push_back({t.name, t.dtype, t.shape});
  io::LoadedStateDict loaded;
  try {
    loaded = io::load_state_dict(path, model, load_options);
  } catch (const Error& e) {
    throw Error("checkpoint '" + path + "' cannot be used: " + e.what());
  }
  r.state = read_state(path, loaded.metadata, options);
  check_second_moments(path, loaded.extra);
  try {
    optimizer.load_state(loaded.extra, r.state.optimizer_updates);
  } catch (const Error& e) {
    throw Error("checkpoint '" + path + "': its optimizer state does not fit this run: " + e.what());
  }
  r.metadata = std::move(loaded.metadata);
  return r;
}

ResumePoint::ResumePoint(Trainer& trainer, const CheckpointState& start)
    : trainer_(trainer), start_(start), point_(start) {}

EpochOptions ResumePoint::begin_epoch(int epoch, EpochOptions options) {
  const bool resuming = epoch == start_.counters.epoch;
  options.first = resuming ? start_.counters.micro_batch_index : 0;
  loss_before_ = resuming ? start_.epoch_loss_sum : 0.0;
  const int64_t units_before = resuming ? start_.epoch_units : 0;
  point_.counters = trainer_.counters();  // as train_epoch's begin_epoch will set them
  point_.counters.epoch = epoch;
  point_.counters.micro_batch_index = options.first;
  point_.epoch_units = units_before;
  options.on_step = [this, units_before, then = std::move(options.on_step)](const MicroBatchDone& done) {
    const TrainingPosition now = trainer_.position();
    point_.counters.micro_batch_index = now.micro_batch_index;
    point_.counters.micro_batches_total = now.micro_batches_total;
    point_.epoch_units = units_before + done.units_done;
    if (then) then(done);
  };
  return options;
}

void ResumePoint::end_epoch() {
  const int next = point_.counters.epoch + 1;
  point_.counters = trainer_.counters();
  point_.counters.epoch = next;
  point_.counters.micro_batch_index = 0;
  point_.epoch_units = 0;
  loss_before_ = 0.0;
}

double ResumePoint::mean_loss() const {
  const double units = static_cast<double>(std::max<int64_t>(point_.epoch_units, 1));
  return (loss_before_ + trainer_.counters().epoch_loss_sum) / units;
}

CheckpointState ResumePoint::state() const {
  CheckpointState s = point_;
  const TrainingCounters now = trainer_.counters();
  s.counters.optimizer_steps = now.optimizer_steps;
  s.counters.skipped_steps = now.skipped_steps;
  s.counters.loss_scale = now.loss_scale;
  s.counters.loss_scale_clean_steps = now.loss_scale_clean_steps;
  s.counters.last_lr = now.last_lr;
  s.counters.accum_steps_override = now.accum_steps_override;
  s.optimizer_updates = trainer_.optimizer().updates();
  s.epoch_loss_sum = s.counters.micro_batch_index == 0 ? 0.0 : loss_before_ + now.epoch_loss_sum;
  return s;
}

bool is_training_checkpoint(const std::string& path) {
  const io::SafetensorsHeader header = io::read_safetensors_header(path);
  auto format = header.metadata.find("format");
  return format != header.metadata.end() && format->second.rfind(kFormatPrefix, 0) == 0;
}

}  // namespace cumulus::train

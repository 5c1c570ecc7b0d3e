#include "checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"

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

// One recorded setting: its metadata key, the flag that sets it, its value as text (equal floats
// give equal text), and whether --override may change it.
struct Setting {
  std::string key, flag, value;
  bool overridable;
  // What a checkpoint written before the setting existed ran with (nullptr: the setting was always recorded).
  const char* before_recorded = nullptr;
};

// The shortest text that reads back as the same float: "0.001", not "0.00100000005".
std::string float_text(float v) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}

// Every setting that changes the result of a run (Note [Resume contract] in checkpoint.h).
std::vector<Setting> run_settings(const Options& o) {
  // Accumulation is recorded as micro-batches per step, all ranks together: a checkpoint written by
  // 4 ranks of 16 x 1 resumes on 2 ranks of 16 x 2 or 1 of 16 x 4 (the same global groups).
  std::string schedule;
  for (const auto& [e, s] : o.schedule)
    schedule += (schedule.empty() ? "" : ",") + std::to_string(e) + ":" + std::to_string(s * o.world_size);
  const bool adamw = o.optimizer == "adamw";
  std::vector<Setting> s = {
      {"model", "--model", o.model, false},
      {"optimizer", "--optimizer", o.optimizer, false},
      {"micro_batch_size", "--batch-size", std::to_string(o.batch_size), false},
      {"accum_steps", "--accum-steps", schedule.empty() ? std::to_string(o.accum_steps * o.world_size) : schedule,
       false},
      {"normalize", "--normalize", o.normalize, false},
      {"precision", "--precision", o.precision, false, "fp32"},
      {"shuffle", "--shuffle", o.shuffle ? "true" : "false", false},
      {"seed", "--seed", std::to_string(o.seed), false},
      {"train_limit", "--train-limit", std::to_string(o.train_limit), false},
      // The momentum buffer exists only with momentum: changing it would drop or invent state.
      {"momentum", "--momentum", float_text(o.momentum), false},
      {"lr", "--lr", float_text(o.lr), true},
      {"lr_schedule", "--lr-schedule", o.lr_schedule, true},
      {"weight_decay", "--weight-decay", float_text(o.resolved_weight_decay()), true},
      {"clip_grad_norm", "--clip-grad-norm", float_text(o.clip_grad_norm), true},
  };
  if (o.lr_schedule == "step") {
    s.push_back({"lr_step_size", "--lr-step-size", std::to_string(o.lr_step_size), true});
    s.push_back({"lr_gamma", "--lr-gamma", float_text(o.lr_gamma), true});
  }
  if (o.lr_schedule == "cosine") {
    s.push_back({"warmup_steps", "--warmup-steps", std::to_string(o.warmup_steps), true});
    s.push_back({"min_lr", "--min-lr", float_text(o.min_lr), true});
    // The cosine decays to the run's last step, which --epochs sets.
    s.push_back({"epochs", "--epochs", std::to_string(o.epochs), false});
  }
  if (adamw) {
    s.push_back({"betas", "--betas", float_text(o.beta1) + "," + float_text(o.beta2), true});
    s.push_back({"eps", "--eps", float_text(o.eps), true});
  } else {
    s.push_back({"nesterov", "--nesterov", o.nesterov ? "true" : "false", true});
  }
  return s;
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

std::vector<std::pair<std::string, std::string>> recorded_settings(const Options& options) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Setting& s : run_settings(options)) out.emplace_back(s.flag.substr(2), s.value);
  return out;
}

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
                     const cumulus::optim::Optimizer& optimizer, const TrainingState& s, const Options& options) {
  std::map<std::string, std::string> meta;
  for (const Setting& setting : run_settings(options)) meta["setting." + setting.key] = setting.value;
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
                              cumulus::optim::Optimizer& optimizer, const Options& options,
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
  for (const Setting& setting : run_settings(options)) {
    auto it = header.metadata.find("setting." + setting.key);
    const std::string saved = it != header.metadata.end() ? cumulus::excerpt(it->second)
                              : setting.before_recorded != nullptr ? setting.before_recorded
                                                                   : "(not recorded)";
    if (saved == setting.value) continue;
    const std::string name = setting.flag.substr(2);
    if (setting.overridable && options.overrides.count(name) == 1 && it != header.metadata.end()) {
      s.overridden.push_back(name + " " + saved + " -> " + setting.value);
      continue;
    }
    const char* unit = setting.key == "accum_steps" ? " (micro-batches per step, all ranks together)" : "";
    throw UsageFailure("--resume '" + path + "' was made with " + setting.flag + " " + saved + ", this run has " +
                       setting.value + unit + "; resume with the same value" +
                       (setting.overridable ? " or allow the change with --override " + name : ""));
  }
  io::LoadStateDictOptions load_options;
  load_options.extra_prefix = kOptimizerPrefix;
  load_options.require_finite = true;
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
    s.counters.loss_scale_clean_steps =
        static_cast<int32_t>(counter("loss_scale_clean_steps", 0, std::numeric_limits<int32_t>::max()));
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

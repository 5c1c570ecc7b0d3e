// A program's command line, whatever parser reads it: strict integer checks on a flag's text, flags
// that name one of a set of values, an accumulation schedule's text, help text wrapped to the
// terminal, and what --version says about the build. Plain strings in and out: a program wraps the
// checks in its parser's validators (apps/fashion_mnist does, with CLI11).
//
//   if (std::string problem = integer_text_problem(text, 1, 1 << 20); !problem.empty()) fail(problem);
//   const FlagChoices<Model> models{"--model", "model", {{"mlp", Model::mlp}, {"cnn", Model::cnn}}};
//   Model model = models.parse(text);  // "--model 'x': unknown model (expected mlp or cnn)"
//   std::printf("%s", wrap_help_text(help, help_columns() - 1, 34).c_str());
//   std::printf("%s", version_text("my_app").c_str());
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/error.h"

namespace cumulus::app {

// Why `text` is not a decimal integer in [lo, hi] ("expected an integer from 1 to 64, got '1e3'"),
// or "" when it is one. Checked on the text: a parser that converts first reads "1e23" or "-1" as
// the nearest value it can hold and carries on.
std::string integer_text_problem(const std::string& text, int64_t lo, int64_t hi);
// The same for an unsigned 64-bit integer (0 to 18446744073709551615), a seed say.
std::string unsigned_64_text_problem(const std::string& text);

// A flag whose value names one of a fixed set (an enum's values), both ways, and the message a
// value outside it gets.
template <class E>
struct FlagChoices {
  const char* flag;  // "--model"
  // "model": "--model 'x': unknown model (expected mlp or cnn)"; nullptr: "--model 'x': expected mlp or cnn".
  const char* noun;
  std::vector<std::pair<const char*, E>> values;  // in the order messages list them

  // The value `text` names; InvalidArgument naming the flag and every value otherwise.
  E parse(const std::string& text) const {
    for (const auto& [name, value] : values)
      if (text == name) return value;
    const std::string expected = "expected " + listed();
    throw InvalidArgument(std::string(flag) + " '" + text + "': " +
                          (noun != nullptr ? "unknown " + std::string(noun) + " (" + expected + ")" : expected));
  }
  // The name of `value`, which must be in the table (InvalidArgument otherwise).
  const char* name(E value) const {
    for (const auto& [name, v] : values)
      if (v == value) return name;
    throw InvalidArgument(std::string(flag) + ": a value missing from its table");
  }
  // Every name in order, then `extra` if given (a parser's list of what the flag accepts).
  std::vector<std::string> names(const char* extra = nullptr) const {
    std::vector<std::string> out;
    for (const auto& entry : values) out.push_back(entry.first);
    if (extra != nullptr) out.push_back(extra);
    return out;
  }
  // "a or b", "a, b or c".
  std::string listed() const {
    std::string out;
    for (std::size_t i = 0; i < values.size(); ++i)
      out += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + std::string(values[i].first);
    return out;
  }
};

// The width to wrap help text to: standard output's terminal's, else $COLUMNS, else 100 (a width
// under 40 is passed over).
int help_columns();

// `help` with every line longer than `width` broken at spaces. An option's line ("  --flag ...",
// its description starting at `description_column`) continues under its description, any other
// line under its own indent (at most 20). A word longer than the width stays whole.
std::string wrap_help_text(const std::string& help, int width, std::size_t description_column);

// The device a --device flag names: "auto" is CUDA device 0 where a GPU is usable, else the CPU;
// any other text is Device::parse's, checked usable now (check_device_available). Throws what
// those throw.
Device device_from_flag(const std::string& text);

// A per-epoch accumulation schedule as text, "EPOCH:STEPS,...": "0:8,4:2" is {{0, 8}, {4, 2}}, 8
// micro-batches a step from epoch 0 and 2 from epoch 4 (train::AccumulationOptions::schedule).
// Epochs from 0 to 1000000, each once, the first 0; steps from 1 to 1000000. Throws InvalidArgument
// whose message starts with the quoted text and says what is wrong.
std::map<int, int> parse_accum_schedule(const std::string& text);
// The schedule as parse_accum_schedule reads it: {{0, 8}, {4, 2}} is "0:8,4:2".
std::string accum_schedule_text(const std::map<int, int>& schedule);

// The help of the optimizer-state flags both apps take: --optimizer-bits 32|8|auto,
// --optimizer-state device|host|auto and --zero 0|1|2. `state` names the state ("AdamW's moments");
// `eager_note` is added to the host placement's help where the app replays CUDA graphs.
struct OptimizerStateHelp {
  std::string bits, placement, zero;
};
OptimizerStateHelp optimizer_state_help(const std::string& state, const std::string& eager_note = "");

// What --version prints: "<program> (cumulus) 0.1.0", then the commit the library was configured
// at and its build type, then the backends compiled in (CUDA, cuDNN, the data-parallel transports).
std::string version_text(const std::string& program);

}  // namespace cumulus::app

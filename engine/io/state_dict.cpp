#include "cumulus/io/state_dict.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "cumulus/core/error.h"
#include "engine/tensor/tensor_impl.h"
#include "kernels/float16.h"

namespace cumulus::io {

namespace {

std::string where(const std::string& source, const std::string& name) {
  return "file '" + source + "': tensor '" + name + "'";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return !prefix.empty() && s.compare(0, prefix.size(), prefix) == 0;
}

// Element i of a host tensor as a double (every value of our dtypes is exact in a double).
double read_value(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::i32: return t.data<int32_t>()[i];
    case DType::u8: return t.data<uint8_t>()[i];
    case DType::boolean: return static_cast<const uint8_t*>(t.raw_data())[i];
    case DType::i64: return static_cast<double>(t.data<int64_t>()[i]);  // exact to 2^53
    case DType::bf16: return kernels::bf16_to_f32(static_cast<const uint16_t*>(t.raw_data())[i]);
    case DType::f16: return kernels::f16_to_f32(static_cast<const uint16_t*>(t.raw_data())[i]);
  }
  return 0.0;
}

// Stores v as element i of `out` if it is exactly representable there (NaN and infinities count as
// exact for the floating types).
bool write_exact(Tensor& out, int64_t i, double v) {
  switch (out.dtype()) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      if (!std::isnan(v) && static_cast<double>(f) != v) return false;
      out.data<float>()[i] = f;
      return true;
    }
    case DType::bf16:
    case DType::f16: {
      // Rounded, then kept only if nothing was lost (a NaN stays a NaN).
      const float f = static_cast<float>(v);
      const bool bf16 = out.dtype() == DType::bf16;
      const uint16_t h = bf16 ? kernels::f32_to_bf16(f) : kernels::f32_to_f16(f);
      if (!std::isnan(v) && static_cast<double>(bf16 ? kernels::bf16_to_f32(h) : kernels::f16_to_f32(h)) != v)
        return false;
      static_cast<uint16_t*>(out.raw_data())[i] = h;
      return true;
    }
    case DType::i32:
      if (!std::isfinite(v) || v != std::floor(v) || v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max())
        return false;
      out.data<int32_t>()[i] = static_cast<int32_t>(v);
      return true;
    case DType::u8:
      if (!std::isfinite(v) || v != std::floor(v) || v < 0 || v > 255) return false;
      out.data<uint8_t>()[i] = static_cast<uint8_t>(v);
      return true;
    case DType::i64:  // within +-2^63 (both bounds are exact doubles; the upper one is excluded)
      if (!std::isfinite(v) || v != std::floor(v) || v < -9223372036854775808.0 || v >= 9223372036854775808.0)
        return false;
      out.data<int64_t>()[i] = static_cast<int64_t>(v);
      return true;
    case DType::boolean:
      if (v != 0.0 && v != 1.0) return false;
      static_cast<uint8_t*>(out.raw_data())[i] = static_cast<uint8_t>(v);
      return true;
  }
  return false;
}

// Integers in full (16777217, not 1.67772e+07: the point is often the last digit), others to 9
// significant digits.
std::string format_value(double v) {
  std::ostringstream os;
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e18) os << static_cast<long long>(v);
  else os << std::setprecision(9) << v;
  return os.str();
}

void check_finite(const std::string& source, const std::string& name, const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw Error(where(source, name) + ": element " + std::to_string(i) + " is " + format_value(v[i]) +
                  " (non-finite values are refused)");
}

}  // namespace

// Note [State-dict dtypes]
// Files from PyTorch do not always hold the dtype our module uses: batch norm's num_batches_tracked
// is int64 there (load_safetensors hands it over as i32, range-checked), weights may be bf16 or f16, and a
// converted or hand-made file may hold a float counter. We convert only where no value changes, and
// check every element rather than the dtype pair alone: i32 -> f32 is exact for |v| <= 2^24 but not
// beyond, f32 -> i32 only for integral values. A silently rounded weight or counter would make a
// model that "loads" but evaluates differently from the one saved; refusing names the first value
// that would change, so the user can convert deliberately.
Tensor convert_exact(const Tensor& t, DType to, const std::string& what) {
  const Tensor src = t.to(Device::cpu());
  Tensor out = Tensor::empty(src.shape(), to, Device::cpu());
  const int64_t n = src.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = read_value(src, i);
    if (!write_exact(out, i, v))
      throw Error(what + ": dtype " + dtype_name(src.dtype()) + " in the file, " + dtype_name(to) +
                  " in the module, and element " + std::to_string(i) + " (" + format_value(v) +
                  ") is not exactly representable in " + dtype_name(to));
  }
  return out;
}

void save_state_dict(const std::string& path, const nn::Module& module,
                     const std::map<std::string, std::string>& metadata, const ExtraTensors& extra,
                     OutputLinks links) {
  NamedTensors tensors = module.state_dict();
  tensors.reserve(tensors.size() + extra.tensors.size());
  for (const auto& [name, t] : extra.tensors) tensors.emplace_back(extra.prefix + name, t);
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");  // kept when the caller set one
  save_safetensors(path, tensors, meta, links);
}

namespace {

struct Layout {
  std::vector<std::string> missing, unexpected;
};

// Another name the module's state dict has for `t` (a shared parameter, Note [Shared parameters] in
// nn/module.h) that the file holds, or "".
std::string shared_name_in_file(const NamedTensors& state, const std::string& name, const Tensor& t,
                                const std::map<std::string, const Shape*>& file_names) {
  for (const auto& [other, u] : state)
    if (other != name && impl_of(u) == impl_of(t) && file_names.count(other) == 1) return other;
  return "";
}

// The file's tensor names and shapes against the module's state dict: throws naming the file and
// the tensor for a shape that differs, a missing tensor (unless allowed) or an unexpected one
// outside the extra prefix (unless allowed). It needs no tensor data, so load_state_dict runs it
// on the header before reading any.
Layout check_layout(const std::string& source, const std::vector<std::pair<std::string, Shape>>& file_tensors,
                    const nn::Module& module, const LoadStateDictOptions& options) {
  Layout layout;
  std::map<std::string, const Shape*> by_name;
  for (const auto& [name, shape] : file_tensors) by_name.emplace(name, &shape);
  const std::map<std::string, const Shape*> file_names = by_name;
  const NamedTensors state = module.state_dict();
  std::string shared_hint;  // for the first missing name, when the file has it under another
  for (const auto& [name, target] : state) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      const std::string other = shared_name_in_file(state, name, target, file_names);
      if (!other.empty() && options.allow_missing_shared) continue;  // loaded under `other`
      if (layout.missing.empty() && !other.empty())
        shared_hint = " (the module shares it with '" + other +
                      "', which the file holds; allow_missing_shared loads it from there)";
      layout.missing.push_back(name);
      continue;
    }
    if (*it->second != target.shape())
      throw Error(where(source, name) + ": shape " + it->second->str() + " in the file, " + target.shape().str() +
                  " in the module");
    by_name.erase(it);
  }
  if (!layout.missing.empty() && !options.allow_missing)
    throw Error(where(source, layout.missing.front()) + ": not in the file, but in the module's state dict" +
                shared_hint +
                (layout.missing.size() > 1 ? " (" + std::to_string(layout.missing.size()) + " such tensors)" : ""));
  for (const auto& [name, shape] : file_tensors)
    if (by_name.count(name) == 1 && !starts_with(name, options.extra_prefix)) layout.unexpected.push_back(name);
  if (!layout.unexpected.empty() && !options.allow_unexpected)
    throw Error(where(source, layout.unexpected.front()) + ": in the file, but not in the module's state dict" +
                (options.extra_prefix.empty() ? "" : " nor under '" + options.extra_prefix + "'") +
                (layout.unexpected.size() > 1 ? " (" + std::to_string(layout.unexpected.size()) + " such tensors)"
                                              : ""));
  return layout;
}

// The file's tensors under the extra prefix against options.extra_layout (when set).
void check_extra_layout(const std::string& source, const std::vector<SafetensorsTensorInfo>& file_tensors,
                        const LoadStateDictOptions& options) {
  if (!options.extra_layout || options.extra_prefix.empty()) return;
  for (const SafetensorsTensorInfo& t : file_tensors) {
    if (!starts_with(t.name, options.extra_prefix)) continue;
    const std::string short_name = t.name.substr(options.extra_prefix.size());
    const SafetensorsTensorInfo* expected = nullptr;
    for (const SafetensorsTensorInfo& e : *options.extra_layout)
      if (e.name == short_name) expected = &e;
    if (expected == nullptr)
      throw Error(where(source, t.name) + ": not a tensor this run keeps under '" + options.extra_prefix + "'");
    if (t.dtype != expected->dtype || t.shape != expected->shape)
      throw Error(where(source, t.name) + ": " + dtype_name(t.dtype) + " " + t.shape.str() + " in the file, " +
                  dtype_name(expected->dtype) + " " + expected->shape.str() + " expected");
  }
}

struct Copy {
  std::string name;
  Tensor target;  // the module's tensor
  Tensor value;   // what goes into it: the file's tensor, or its conversion
};

// A shared parameter the file holds under several names is one tensor: the values must agree bit
// for bit (a file saved from the tied model does), and one copy loads it. Values that differ are
// refused rather than one taken silently (PyTorch copies both, the last wins): they mean the file
// is not of a tied model.
void drop_shared_copies(const std::string& source, std::vector<Copy>& copies) {
  std::vector<Copy> kept;
  for (Copy& c : copies) {
    const Copy* first = nullptr;
    for (const Copy& k : kept)
      if (impl_of(k.target) == impl_of(c.target)) first = &k;
    if (first == nullptr) {
      kept.push_back(std::move(c));
      continue;
    }
    const Tensor a = first->value.to(Device::cpu()), b = c.value.to(Device::cpu());
    if (std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0)
      throw Error(where(source, c.name) + ": differs from '" + first->name +
                  "' in the file, but the module shares one tensor under both names");
  }
  copies = std::move(kept);
}

}  // namespace

LoadedStateDict copy_state_dict(const std::string& source, const SafetensorsContents& contents,
                                const nn::Module& module, const LoadStateDictOptions& options) {
  std::vector<std::pair<std::string, Shape>> file_tensors;
  std::vector<SafetensorsTensorInfo> infos;
  for (const auto& [name, t] : contents.tensors) {
    file_tensors.emplace_back(name, t.shape());
    infos.push_back({name, t.dtype(), t.shape()});
  }
  Layout layout = check_layout(source, file_tensors, module, options);
  check_extra_layout(source, infos, options);
  LoadedStateDict result;
  result.metadata = contents.metadata;
  result.missing = std::move(layout.missing);
  result.unexpected = std::move(layout.unexpected);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : contents.tensors) by_name.emplace(name, &t);

  // Check everything first, copy after: a failed load leaves the module untouched.
  std::vector<Copy> copies;
  for (const auto& [name, target] : module.state_dict()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // missing, and allowed
    const Tensor& t = *it->second;
    by_name.erase(it);
    if (t.dtype() == target.dtype()) {
      copies.push_back({name, target, t});
    } else if (options.convert_dtypes) {
      copies.push_back({name, target, convert_exact(t, target.dtype(), where(source, name))});
    } else {
      throw Error(where(source, name) + ": dtype " + dtype_name(t.dtype()) + " in the file, " +
                  dtype_name(target.dtype()) + " in the module (dtype conversion is off)");
    }
  }
  drop_shared_copies(source, copies);
  // What is left in the file under the prefix is extra; keep the file's order.
  for (const auto& [name, t] : contents.tensors)
    if (by_name.count(name) == 1 && starts_with(name, options.extra_prefix))
      result.extra.emplace_back(name.substr(options.extra_prefix.size()), t);

  if (options.require_finite) {
    for (const Copy& c : copies)
      if (c.value.dtype() == DType::f32) check_finite(source, c.name, c.value);
    for (const auto& [name, t] : result.extra)
      if (t.dtype() == DType::f32) check_finite(source, options.extra_prefix + name, t);
  }
  for (Copy& c : copies) c.target.copy_from(c.value);
  return result;
}

LoadedStateDict load_state_dict(const std::string& path, const nn::Module& module,
                                const LoadStateDictOptions& options) {
  // Names and shapes from the header first: a file for another model, or a forged shape, is
  // refused before any tensor is allocated or read.
  const SafetensorsHeader header = read_safetensors_header(path);
  std::vector<std::pair<std::string, Shape>> file_tensors;
  for (const SafetensorsTensorInfo& t : header.tensors) file_tensors.emplace_back(t.name, t.shape);
  check_layout(path, file_tensors, module, options);
  check_extra_layout(path, header.tensors, options);
  return copy_state_dict(path, load_safetensors(path), module, options);
}

}  // namespace cumulus::io

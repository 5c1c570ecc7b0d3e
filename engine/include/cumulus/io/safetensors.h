// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str:
// str}}, then the raw little-endian data. Weights saved with PyTorch's state-dict names load in
// PyTorch with safetensors.torch.load_file and back (docs/ARCHITECTURE.md, "Files").
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/io/file.h"
#include "cumulus/tensor/tensor.h"

namespace cumulus::io {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes atomically (temporary file, fsync, rename). dtypes f32 -> "F32", i32 -> "I32", u8 -> "U8",
// bf16 -> "BF16", f16 -> "F16", i64 -> "I64", bool -> "BOOL". Tensors on CUDA are copied to the host.
// Names must be unique. `links`: whether a symlink at `path` is written through (io/file.h).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      OutputLinks links = OutputLinks::follow);

struct SafetensorsContents {
  NamedTensors tensors;  // in file order of their data offsets
  std::map<std::string, std::string> metadata;
};

// Reads a file, validating the header (length within the file, JSON nested at most 8 deep, known
// dtypes, shapes that match their byte ranges, ranges inside the data and not overlapping).
// Errors name the file and the fault, and quote at most ~80 characters of the file's content.
// Only a regular file is read: a FIFO, a directory or a device is refused, never waited on.
// Tensors are placed on `device` (category: the current scope's). Stored dtypes load as:
//   F32 -> f32, I32 -> i32, U8 -> u8, BF16 -> bf16, F16 -> f16 (the raw bits; Tensor::to(DType::f32)
//               widens bf16 and f16 exactly)
//   F64 -> f32 (rounded to nearest; finite values beyond the f32 range become +-inf)
//   I64 -> i32 (every value range-checked: one outside i32 is an Error naming the file, the
//               tensor and the value)
//   BOOL -> bool (every byte checked to be 0 or 1: another is an Error naming the tensor and index)
// Other dtypes (I8, I16, U16, U32, U64, F8_*) are an Error naming the tensor.
SafetensorsContents load_safetensors(const std::string& path, Device device = Device::cpu());

// The header alone, validated as load_safetensors validates it (the checksum, which covers the
// data, is not checked): names, the dtypes the tensors load as, shapes, and the metadata. Reading
// it costs no allocation of tensor size, so a file can be checked against a model (names, shapes)
// before its data is read; a forged header cannot make the reader allocate what the model would
// refuse anyway.
struct SafetensorsTensorInfo {
  std::string name;
  DType dtype;  // as loaded (see above)
  Shape shape;
};
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;  // in file order of their data offsets
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader read_safetensors_header(const std::string& path);

}  // namespace cumulus::io

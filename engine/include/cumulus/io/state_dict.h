// A module's state dict (its parameters and buffers, with PyTorch's names) saved to and loaded from
// a safetensors file, so weights move both ways between cumulus and PyTorch:
//   PyTorch:  save_file(model.state_dict(), path)  /  model.load_state_dict(load_file(path))
//   cumulus:  io::save_state_dict(path, model)      /  io::load_state_dict(path, model)
//
// Loading is all or nothing: every tensor is checked (names, shapes, dtypes) before any is copied,
// so a failed load leaves the module as it was. Errors name the file and the tensor.
//
// Shared parameters (Note [Shared parameters] in nn/module.h) are saved under each of their names,
// as PyTorch's state_dict has them; a load takes a file with every name, whose values must then
// agree bit for bit (else an error naming both), or, with allow_missing_shared, one of them.
//
// dtypes: a file tensor whose dtype differs from the module's is converted when every value is
// represented exactly in the module's dtype (Note [State-dict dtypes] in state_dict.cpp): bf16 and
// f16 -> f32 always; i32 -> f32 for integers up to 2^24 in magnitude; f32 -> i32 for integral values in
// range (PyTorch's int64 num_batches_tracked arrives as i32 from load_safetensors). Anything else
// is refused.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "cumulus/io/safetensors.h"
#include "cumulus/nn/module.h"

namespace cumulus::io {

// Tensors stored beside the module's, under a name prefix (a checkpoint's "optimizer." state).
// Names here are without the prefix.
struct ExtraTensors {
  std::string prefix;
  NamedTensors tensors;
};

// Writes module.state_dict() (and `extra`, each name prefixed with extra.prefix) atomically.
// Metadata "format" defaults to "pt", as safetensors.torch.save_file writes it (some PyTorch
// loaders check it); a "checksum_crc32" key makes the file carry a CRC-32 (see safetensors.h).
// `links`: whether a symlink at `path` is written through (io/file.h).
void save_state_dict(const std::string& path, const nn::Module& module,
                     const std::map<std::string, std::string>& metadata = {}, const ExtraTensors& extra = {},
                     OutputLinks links = OutputLinks::follow);

struct LoadStateDictOptions {
  // Non-empty: file tensors whose names start with it are not the module's; they are returned in
  // LoadedStateDict::extra (prefix removed) instead of being an error.
  std::string extra_prefix;
  // PyTorch's strict=False, split in two: module tensors the file lacks keep their values; file
  // tensors the module lacks (outside extra_prefix) are ignored.
  bool allow_missing = false;
  bool allow_unexpected = false;
  // A shared parameter (Note [Shared parameters] in nn/module.h) is in the state dict under each
  // of its names, and PyTorch's load_state_dict (strict) requires every name, as this does by
  // default. true: a name the file lacks is not missing when the file holds another name of the
  // same tensor (safetensors.torch.load_model's rule, since its save_model writes one name per
  // shared tensor: Hugging Face's GPT-2 file holds the token embedding and no lm_head.weight).
  // Such names are then not listed in LoadedStateDict::missing.
  bool allow_missing_shared = false;
  // false: a dtype that differs from the module's is an error, even where exact.
  bool convert_dtypes = true;
  // true: a NaN or an infinity in an f32 tensor of the module's, or among the extra tensors (a
  // checkpoint's optimizer state), is an error (training from it produces only non-finite losses
  // or skipped steps); checked before anything is copied.
  bool require_finite = false;
  // Set: every file tensor under extra_prefix must be one of these (name without the prefix, dtype
  // as loaded, shape). Checked on the header, before any tensor is allocated or read, so a forged
  // shape cannot make the load allocate what the run never needs.
  std::optional<std::vector<SafetensorsTensorInfo>> extra_layout;
};

struct LoadedStateDict {
  std::map<std::string, std::string> metadata;  // the file's
  // The tensors under options.extra_prefix, prefix removed (on the host from load_state_dict).
  NamedTensors extra;
  std::vector<std::string> missing;             // module tensors not in the file (allow_missing)
  std::vector<std::string> unexpected;          // file tensors ignored (allow_unexpected)
};

// Reads `path` (load_safetensors: header validated, checksum verified when present) and copies its
// tensors into the module's (any device). Throws cumulus::Error naming the file and the tensor:
// a tensor missing or unexpected, a shape that differs, a dtype that does not convert exactly.
LoadedStateDict load_state_dict(const std::string& path, const nn::Module& module,
                                const LoadStateDictOptions& options = {});

// The copying half of load_state_dict, for callers that read the file themselves (to check its
// metadata before touching the module). `source` names the file in error messages.
LoadedStateDict copy_state_dict(const std::string& source, const SafetensorsContents& contents,
                                const nn::Module& module, const LoadStateDictOptions& options = {});

// `t` as dtype `to` on the host, when every value converts exactly; otherwise throws cumulus::Error
// with `what` (e.g. "file 'x': tensor 'y'") and the first value that does not.
Tensor convert_exact(const Tensor& t, DType to, const std::string& what);

}  // namespace cumulus::io

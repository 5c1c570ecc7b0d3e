// Fuzzes cumulus::io::load_safetensors (engine/io/safetensors.cpp). The input is the file. What
// loads must be consistent (no more tensor bytes than what the file holds: F64 and I64 narrow,
// nothing grows) and must survive a round trip: saved again (converted dtypes as what they loaded
// as) and reloaded, the same names, shapes, dtypes, bytes and metadata.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "cumulus/core/error.h"
#include "cumulus/io/safetensors.h"
#include "fuzz_input.h"

namespace {

// `with_checksum` false: the checksum's value may differ (a file whose dtypes were converted on
// load saves with the checksum of what it loaded as).
bool same(const cumulus::io::SafetensorsContents& a, const cumulus::io::SafetensorsContents& b, bool with_checksum) {
  auto meta_a = a.metadata, meta_b = b.metadata;
  if (!with_checksum && meta_a.count("checksum_crc32") && meta_b.count("checksum_crc32"))
    meta_a["checksum_crc32"] = meta_b["checksum_crc32"];
  if (meta_a != meta_b || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [na, ta] = a.tensors[i];
    const auto& [nb, tb] = b.tensors[i];
    if (na != nb || ta.dtype() != tb.dtype() || ta.shape() != tb.shape() || ta.nbytes() != tb.nbytes()) return false;
    if (ta.nbytes() > 0 && std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static cumulus::fuzz::InputFile file("fuzz_safetensors");
  static const std::string resaved = (std::filesystem::temp_directory_path() /
                                      ("cumulus_fuzz_safetensors_" + std::to_string(::getpid()) + ".safetensors"))
                                         .string();
  file.write(data, size);
  cumulus::io::SafetensorsContents loaded;
  try {
    loaded = cumulus::io::load_safetensors(file.path());
  } catch (const cumulus::Error&) {
    return 0;  // the expected outcome for malformed input
  }
  std::size_t bytes = 0;
  for (const auto& [name, t] : loaded.tensors) bytes += t.nbytes();
  if (bytes > size) __builtin_trap();
  // A file with a checksum saves with a freshly computed one. Converted dtypes (F64, I64) save
  // as what they loaded as, so the first round trip may change the checksum's value; a second one,
  // of dtypes saved as they are held, must reproduce it exactly.
  cumulus::io::save_safetensors(resaved, loaded.tensors, loaded.metadata);
  const cumulus::io::SafetensorsContents again = cumulus::io::load_safetensors(resaved);
  cumulus::io::save_safetensors(resaved, again.tensors, again.metadata);
  const cumulus::io::SafetensorsContents again2 = cumulus::io::load_safetensors(resaved);
  std::filesystem::remove(resaved);
  if (!same(loaded, again, /*with_checksum=*/false) || !same(again, again2, /*with_checksum=*/true)) __builtin_trap();
  return 0;
}

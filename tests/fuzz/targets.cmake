# libFuzzer targets, defined when CUMULUS_FUZZ=ON (clang): the top-level CMakeLists.txt includes
# this file after the engine target, having compiled every C++ target with coverage and
# sanitizers. scripts/fuzz.sh builds and runs them from the seed corpora in corpus/<target>/. Each
# target hands the input to a reader as a file and accepts only cumulus::Error: any other
# exception, crash, sanitizer report, hang or oversized allocation is a finding.
foreach(name fuzz_idx fuzz_safetensors fuzz_size)
  add_executable(${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.cpp)
  target_link_libraries(${name} PRIVATE cumulus::engine ZLIB::ZLIB)
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
endforeach()

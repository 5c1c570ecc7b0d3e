# The CMake package test, run by ctest (label "package") as
#   cmake -DMODE=install|subdirectory -DCUMULUS_SOURCE_DIR=... -DCUMULUS_BUILD_DIR=... -DWORK_DIR=...
#         [-DGENERATOR=... -DCXX_COMPILER=... -DBUILD_TYPE=... -DWITH_CUDA=ON|OFF -DEXTRA_FLAGS=...]
#         -P test_package.cmake
# install:      `cmake --install` of the already-built tree into a fresh prefix, then the consumer in
#               tests/consumer configured with find_package(cumulus), built and run. The packages
#               only our tests, apps and benchmarks use (GoogleTest, Google Benchmark, CLI11) and
#               the header-only nlohmann_json are hidden from it: the package must not need them.
#               Nor may it need the library's own dependencies: the CUDA toolkit, MPI and zlib are
#               hidden from find_package too, the consumer checks that find_package(cumulus) looked
#               for nothing else and that cumulus::engine brings no link dependency, and here the
#               installed headers are scanned for their includes, the consumer's link commands and
#               its ELF dependencies for theirs. The installed library itself does link them (a
#               CUDA build: libcudart), and the consumer runs on the CPU against it with
#               LD_LIBRARY_PATH unset, finding them through the library alone.
# subdirectory: the consumer configured with add_subdirectory(<checkout>) with the same packages
#               hidden; it checks that only the libraries (engine, models) are defined, and compiles
#               its sources against their usage requirements. The libraries are not built again: that
#               takes minutes on a small machine and proves nothing the install mode does not (the
#               same sources and flags); -DCONSUMER_FULL_BUILD=ON on the consumer does it by hand.
cmake_minimum_required(VERSION 3.24)
foreach(var MODE CUMULUS_SOURCE_DIR CUMULUS_BUILD_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "test_package: -D${var}=... is required")
  endif()
endforeach()

set(consumer_src ${CUMULUS_SOURCE_DIR}/tests/consumer)
set(work ${WORK_DIR}/${MODE})
file(REMOVE_RECURSE ${work})
file(MAKE_DIRECTORY ${work})

# Runs a command, echoing it; fails the test with its output when it fails.
function(step)
  string(JOIN " " shown ${ARGN})
  message(STATUS "test_package (${MODE}): ${shown}")
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(TIMESTAMP t1 "%s")
  math(EXPR secs "${t1} - ${t0}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "test_package (${MODE}): failed (${rc}) after ${secs} s: ${shown}\n${out}\n${err}")
  endif()
  message(STATUS "  ok in ${secs} s")
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

set(configure_args -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON
                   -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON)
if(GENERATOR)
  list(APPEND configure_args -G ${GENERATOR})
endif()
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(BUILD_TYPE)
  list(APPEND configure_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
if(EXTRA_FLAGS)  # sanitizer builds: the consumer compiles and links with the same -fsanitize
  list(APPEND configure_args "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
endif()
set(config_args)
if(BUILD_TYPE)
  set(config_args --config ${BUILD_TYPE})
endif()

# The engine's private dependencies, by library name: none may reach the consumer's link or its
# ELF dependencies (the sanitizer runtimes and the C++ runtime may).
set(private_libraries "cudart|cublas|cublasLt|cudnn|nccl|mpi|mpi_cxx|openblas|z")
find_program(READELF readelf)
# The shared libraries an ELF file names (DT_NEEDED) into `var`, as a list; empty without readelf.
function(needed_libraries file var)
  set(names "")
  if(READELF)
    execute_process(COMMAND ${READELF} -d ${file} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "test_package: readelf -d ${file} failed")
    endif()
    string(REGEX MATCHALL "\\(NEEDED\\)[^[]*\\[[^]]*\\]" entries "${dynamic}")
    foreach(entry ${entries})
      string(REGEX REPLACE ".*\\[(.*)\\]" "\\1" name "${entry}")
      list(APPEND names ${name})
    endforeach()
  endif()
  set(${var} ${names} PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  set(prefix ${work}/prefix)
  step(${CMAKE_COMMAND} --install ${CUMULUS_BUILD_DIR} --prefix ${prefix} ${config_args})
  # The prefix holds the library, the package files and <cumulus/...> headers; nothing private.
  file(GLOB_RECURSE config_file ${prefix}/*/cumulusConfig.cmake)
  file(GLOB_RECURSE version_file ${prefix}/*/cumulusConfigVersion.cmake)
  file(GLOB_RECURSE library ${prefix}/*/libcumulus_engine.so)
  file(GLOB_RECURSE models_library ${prefix}/*/libcumulus_models.*)
  file(GLOB include_entries RELATIVE ${prefix}/include ${prefix}/include/*)
  foreach(f config_file version_file library models_library)
    if(NOT ${f})
      message(FATAL_ERROR "test_package: ${f} not installed under ${prefix}")
    endif()
  endforeach()
  if(NOT include_entries STREQUAL "cumulus" OR NOT EXISTS ${prefix}/include/cumulus/cumulus.h OR
     NOT EXISTS ${prefix}/include/cumulus/models/mlp.h)
    message(FATAL_ERROR "test_package: ${prefix}/include holds '${include_entries}', expected cumulus/ with cumulus.h "
                        "and models/mlp.h")
  endif()
  # No installed header may include a header of the library's dependencies: a consumer has none.
  file(GLOB_RECURSE headers ${prefix}/include/*)
  foreach(header ${headers})
    file(STRINGS ${header} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](cuda|cublas|cudnn|curand|nccl|mpi|cblas|openblas|zlib)")
    if(lines)
      message(FATAL_ERROR "test_package: the installed ${header} includes a dependency's header: ${lines}")
    endif()
  endforeach()
  # The library installed is the one with the dependencies: a CUDA build's links the CUDA runtime.
  needed_libraries(${library} library_needs)
  message(STATUS "test_package (${MODE}): ${library} needs ${library_needs}")
  if(WITH_CUDA AND READELF AND NOT library_needs MATCHES "libcudart")
    message(FATAL_ERROR "test_package: the installed library of a CUDA build does not link libcudart: ${library_needs}")
  endif()

  step(${CMAKE_COMMAND} -S ${consumer_src} -B ${work}/build -DCMAKE_PREFIX_PATH=${prefix}
       -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
       -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON ${configure_args})
  if(NOT step_output MATCHES "needs nothing else here")
    message(FATAL_ERROR "test_package: the consumer did not report its package check:\n${step_output}")
  endif()
  # --verbose: the compile and link commands, to search for the private libraries.
  step(${CMAKE_COMMAND} --build ${work}/build ${config_args} -j 2 --verbose)
  if(step_output MATCHES "(-l|[/ ]lib)(${private_libraries})([ .\n]|$)")
    message(FATAL_ERROR "test_package: the consumer's build names a private dependency of cumulus "
                        "('${CMAKE_MATCH_0}'):\n${step_output}")
  endif()
  file(GLOB_RECURSE exe ${work}/build/consumer ${work}/build/*/consumer)
  if(NOT exe)
    message(FATAL_ERROR "test_package: the consumer binary was not built under ${work}/build")
  endif()
  list(GET exe 0 exe)
  needed_libraries(${exe} consumer_needs)
  message(STATUS "test_package (${MODE}): the consumer needs ${consumer_needs}")
  if(READELF AND (consumer_needs MATCHES "(^|;)lib(${private_libraries})[.]" OR NOT consumer_needs MATCHES "libcumulus_engine"))
    message(FATAL_ERROR "test_package: the consumer should link libcumulus_engine and none of its dependencies")
  endif()
  step(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${exe} ${work})
  message(STATUS "${step_output}")
elseif(MODE STREQUAL "subdirectory")
  set(cuda OFF)
  if(WITH_CUDA)
    set(cuda ON)
  endif()
  step(${CMAKE_COMMAND} -S ${consumer_src} -B ${work}/build -DCUMULUS_SOURCE_DIR=${CUMULUS_SOURCE_DIR}
       -DCUMULUS_CUDA=${cuda} ${configure_args})
  if(NOT step_output MATCHES "defines cumulus_engine and cumulus_models alone")
    message(FATAL_ERROR "test_package: the consumer did not report its target check:\n${step_output}")
  endif()
  step(${CMAKE_COMMAND} --build ${work}/build ${config_args} --target main_compiles hidden_headers_compiles)
else()
  message(FATAL_ERROR "test_package: MODE must be install or subdirectory, not '${MODE}'")
endif()
file(REMOVE_RECURSE ${work})
message(STATUS "test_package (${MODE}): passed")

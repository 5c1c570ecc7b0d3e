# Install rules: the engine library (exported as cumulus::engine), the models library on top of it
# (cumulus::models), their public headers and the CMake package, so that after
# `cmake --install <build> --prefix <p>` a project finds them with
#   find_package(cumulus REQUIRED)     # CMAKE_PREFIX_PATH=<p>
#   target_link_libraries(app PRIVATE cumulus::engine)   # or cumulus::models for the MLP and the CNN
include(CMakePackageConfigHelpers)

set(CUMULUS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cumulus CACHE STRING
    "Where cumulusConfig.cmake is installed, relative to the prefix")

install(TARGETS cumulus_engine cumulus_models EXPORT cumulusTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/engine/include/cumulus ${PROJECT_SOURCE_DIR}/models/include/cumulus
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT cumulusTargets NAMESPACE cumulus:: DESTINATION ${CUMULUS_INSTALL_CMAKEDIR})

# What cumulusConfig.cmake must find again on the consumer's side. A static library carries its
# private dependencies into the consumer's link (OpenBLAS, zlib); a shared one links them itself.
get_target_property(CUMULUS_LIBRARY_TYPE cumulus_engine TYPE)
if(CUMULUS_LIBRARY_TYPE STREQUAL "STATIC_LIBRARY")
  set(CUMULUS_STATIC ON)
else()
  set(CUMULUS_STATIC OFF)
endif()
get_filename_component(CUMULUS_OPENBLAS_DIR ${OPENBLAS_LIBRARY} DIRECTORY)
get_filename_component(CUMULUS_OPENBLAS_NAME ${OPENBLAS_LIBRARY} NAME)
if(CUMULUS_WITH_CUDA AND CUDNN_LIBRARY AND CUDNN_INCLUDE_DIR)
  set(CUMULUS_WITH_CUDNN ON)
else()
  set(CUMULUS_WITH_CUDNN OFF)
endif()

if(CUMULUS_WITH_NCCL)
  get_filename_component(CUMULUS_NCCL_DIR ${NCCL_LIBRARY} DIRECTORY)
endif()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/cumulusConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/cumulusConfig.cmake
                              INSTALL_DESTINATION ${CUMULUS_INSTALL_CMAKEDIR})
# 0.x: minor versions may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cumulusConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cumulusConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/cumulusConfigVersion.cmake
        DESTINATION ${CUMULUS_INSTALL_CMAKEDIR})

# Install rules: the engine library (exported as cumulus::engine), the models library on top of it
# (cumulus::models), their public headers and the CMake package, so that after
# `cmake --install <build> --prefix <p>` a project finds them with
#   find_package(cumulus REQUIRED)     # CMAKE_PREFIX_PATH=<p>
#   target_link_libraries(app PRIVATE cumulus::engine)   # or cumulus::models for the MLP and the CNN
# The engine is shared and all its dependencies private (the root CMakeLists.txt says why), so the
# exported targets carry no link dependency of theirs and the package finds nothing on the
# consumer's side.
include(CMakePackageConfigHelpers)

set(CUMULUS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cumulus CACHE STRING
    "Where cumulusConfig.cmake is installed, relative to the prefix")

install(TARGETS cumulus_engine cumulus_models EXPORT cumulusTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The public include tree is installed whole: the CUDA backend's headers, which include the
# toolkit's, live in the private folders (kernels/cuda/, engine/core/), so a consumer needs no toolkit.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/engine/include/cumulus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/include/cumulus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(EXPORT cumulusTargets NAMESPACE cumulus:: DESTINATION ${CUMULUS_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/cumulusConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/cumulusConfig.cmake
                              INSTALL_DESTINATION ${CUMULUS_INSTALL_CMAKEDIR})
# 0.x: minor versions may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cumulusConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cumulusConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/cumulusConfigVersion.cmake
        DESTINATION ${CUMULUS_INSTALL_CMAKEDIR})

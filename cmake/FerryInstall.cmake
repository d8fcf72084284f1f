# Exported CMake package: find_package(ferry) then link ferry::ferry.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS ferry ferry_import ferry_observe ferry_replay ferry_shared EXPORT ferryTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# workload.hpp is the CLI's (an internal layer): not installed.
install(DIRECTORY include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN workload.hpp EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/include/ferry/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ferry)
install(TARGETS ferry_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# pkg-config for C programs: -lferry finds libferry.so (the C ABI) before libferry.a.
# How many folders ${libdir}/pkgconfig lies below the prefix ("lib" -> "../..").
string(REGEX REPLACE "[^/]+" ".." FERRY_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
configure_file(cmake/ferry.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ferry.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# PyTorch's allocator: a plugin loaded by path, not a target to link (not exported).
install(TARGETS ferry_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# `import ferry` (ctypes over libferry.so, no build step) where the Python that
# configured the build looks for the prefix given at install time
# (cmake/python_site_dir.py); the install says where it went.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  install(CODE "set(FERRY_PYTHON \"${Python3_EXECUTABLE}\")
    set(FERRY_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")")
  install(SCRIPT cmake/FerryInstallPython.cmake)
endif()
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
configure_package_config_file(cmake/ferryConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ferryConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ferryConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ferryConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ferryConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

# Run by `cmake --install` (FerryInstall.cmake): python/ferry into the site
# directory that FERRY_PYTHON reads for CMAKE_INSTALL_PREFIX, and where it went.
execute_process(COMMAND "${FERRY_PYTHON}" "${FERRY_SOURCE_DIR}/cmake/python_site_dir.py" "${CMAKE_INSTALL_PREFIX}"
  OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FERRY_PYTHON} cmake/python_site_dir.py ${CMAKE_INSTALL_PREFIX} failed")
endif()
string(REPLACE "\n" ";" site "${site}")
list(GET site 0 site_dir)
list(GET site 1 site_state)
file(INSTALL "${FERRY_SOURCE_DIR}/python/ferry" DESTINATION "${site_dir}" PATTERN __pycache__ EXCLUDE)
if(site_state STREQUAL "on sys.path")
  message(STATUS "import ferry: ${site_dir}/ferry (on the sys.path of ${FERRY_PYTHON})")
else()
  message(STATUS "import ferry: ${site_dir}/ferry; ${FERRY_PYTHON} reads it with PYTHONPATH=${site_dir}")
endif()

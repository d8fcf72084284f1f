# Run by `cmake --install` (FerryInstall.cmake): python/ferry into the site
# directory that FERRY_PYTHON reads for CMAKE_INSTALL_PREFIX, and where it went:
# the directory, then which interpreter reads it and how. FERRY_PYTHON may be a
# pyenv shim or a virtual environment's, not the python3 a reader of the guide
# runs, so the interpreter behind it is named, and Debian's /usr/bin/python3
# gets a line of its own when it is another one.
execute_process(COMMAND "${FERRY_PYTHON}" "${FERRY_SOURCE_DIR}/cmake/python_site_dir.py" "${CMAKE_INSTALL_PREFIX}"
  OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FERRY_PYTHON} cmake/python_site_dir.py ${CMAKE_INSTALL_PREFIX} failed")
endif()
string(REPLACE "\n" ";" site "${site}")
list(GET site 0 site_dir)
file(INSTALL "${FERRY_SOURCE_DIR}/python/ferry" DESTINATION "${site_dir}" PATTERN __pycache__ EXCLUDE)
message(STATUS "import ferry: ${site_dir}/ferry")

# "on sys.path" or not, then "EXECUTABLE VERSION": one line saying how that Python imports it.
function(ferry_python_reader state who role)
  string(REGEX REPLACE " ([^ ]+)$" "" exe "${who}")
  string(REGEX REPLACE "^.* " "" version "${who}")
  if(state STREQUAL "on sys.path")
    message(STATUS "  ${exe} (Python ${version}, ${role}) imports it as it stands")
  else()
    message(STATUS "  ${exe} (Python ${version}, ${role}) imports it with PYTHONPATH=${site_dir}")
  endif()
endfunction()
list(GET site 1 state)
list(GET site 2 who)
ferry_python_reader("${state}" "${who}" "the one cmake configured with")

set(debian /usr/bin/python3)
if(EXISTS ${debian})
  execute_process(COMMAND ${debian} "${FERRY_SOURCE_DIR}/cmake/python_site_dir.py" --reads "${site_dir}"
    OUTPUT_VARIABLE debian_site OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" debian_site "${debian_site}")
    list(GET debian_site 0 debian_state)
    list(GET debian_site 1 debian_who)
    string(REGEX REPLACE " [^ ]+$" "" debian_exe "${debian_who}")
    string(REGEX REPLACE " [^ ]+$" "" exe "${who}")
    if(NOT debian_exe STREQUAL exe)
      ferry_python_reader("${debian_state}" "${debian_who}" "Debian's ${debian}")
    endif()
  endif()
endif()

# cmake -P script: a fresh install of the build into PREFIX (the fixture
# ferry_installed); what the install printed is kept in LOG for the tests that read it.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${FERRY_BUILD_DIR} --prefix ${PREFIX} RESULT_VARIABLE rc
  OUTPUT_VARIABLE out ERROR_VARIABLE out)
file(WRITE ${LOG} "${out}")
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${FERRY_BUILD_DIR} --prefix ${PREFIX} failed (${rc})")
endif()

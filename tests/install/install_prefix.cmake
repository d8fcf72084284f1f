# cmake -P script: a fresh install of the build into PREFIX (the fixture ferry_installed).
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${FERRY_BUILD_DIR} --prefix ${PREFIX} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${FERRY_BUILD_DIR} --prefix ${PREFIX} failed (${rc})")
endif()

# cmake -P script: install, configure the consumer against the prefix, build, run.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${FERRY_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
set(flags "")
if(SANITIZE)
  set(flags "-fsanitize=${SANITIZE}")
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${WORK_DIR}/build
  -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}
  "-DCMAKE_EXE_LINKER_FLAGS=${flags}" "-DCMAKE_CXX_FLAGS=${flags}")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)

# A C program against the installed header and libferry.so, through pkg-config only.
set(prefix ${WORK_DIR}/prefix)
file(GLOB_RECURSE pc_files ${prefix}/*/ferry.pc)
list(LENGTH pc_files found)
if(NOT found EQUAL 1)
  message(FATAL_ERROR "expected one installed ferry.pc, found: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
execute_process(COMMAND pkg-config --cflags --libs ferry OUTPUT_VARIABLE pc_flags RESULT_VARIABLE rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs ferry failed")
endif()
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
run(${C_COMPILER} -std=c11 -Wall -Wextra -pedantic ${flags} ${C_CONSUMER_SOURCE}/main.c ${pc_flags}
  -o ${WORK_DIR}/c_consumer)
get_filename_component(libdir ${pc_dir} DIRECTORY)
set(ENV{LD_LIBRARY_PATH} ${libdir})
run(${WORK_DIR}/c_consumer)

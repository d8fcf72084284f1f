# cmake -P script: examples/c/guide.c built as docs/guide.md §9 says, against the
# installed PREFIX (PKG_CONFIG_PATH, nothing else), and run with no
# LD_LIBRARY_PATH: the rpath from pkg-config finds libferry.so.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
file(GLOB_RECURSE pc_files ${PREFIX}/*/ferry.pc)
list(LENGTH pc_files found)
if(NOT found EQUAL 1)
  message(FATAL_ERROR "expected one installed ferry.pc, found: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
unset(ENV{LD_LIBRARY_PATH})
set(cc ${C_COMPILER})
if(SANITIZE)  # a sanitized libferry.so leaves its runtime to the program
  set(cc "${C_COMPILER} -fsanitize=${SANITIZE}")
endif()
get_filename_component(guide_dir ${SOURCE} DIRECTORY)
execute_process(COMMAND sh -c "${cc} -std=c11 -Wall -Wextra -pedantic -Werror guide.c $(pkg-config --cflags --libs ferry) -o ${WORK_DIR}/guide"
  WORKING_DIRECTORY ${guide_dir} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "guide.c did not build against ${PREFIX} (${rc})")
endif()
execute_process(COMMAND ${WORK_DIR}/guide RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "guide (examples/c/guide.c) failed (${rc})")
endif()

# cmake -P script: examples/rust/guide built as docs/guide.md §9 says: the crate
# copied out of the source tree into WORK_DIR (its path dependency pointed at this
# checkout's rust/ferry, as a user's own crate names it), PKG_CONFIG_PATH at the
# installed PREFIX and nothing else, `cargo build --offline`, then run with no
# LD_LIBRARY_PATH: the crate's build.rs gives it pkg-config's rpath.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
file(COPY ${SOURCE_DIR}/examples/rust/guide/Cargo.toml ${SOURCE_DIR}/examples/rust/guide/build.rs
  ${SOURCE_DIR}/examples/rust/guide/src DESTINATION ${WORK_DIR})
file(READ ${WORK_DIR}/Cargo.toml manifest)
string(REGEX REPLACE "ferry = { path = \"[^\"]*\" }" "ferry = { path = \"${SOURCE_DIR}/rust/ferry\" }"
  relocated "${manifest}")
if(relocated STREQUAL manifest)
  message(FATAL_ERROR "examples/rust/guide/Cargo.toml has no `ferry = { path = \"...\" }` line")
endif()
file(WRITE ${WORK_DIR}/Cargo.toml "${relocated}")

file(GLOB_RECURSE pc_files ${PREFIX}/*/ferry.pc)
list(LENGTH pc_files found)
if(NOT found EQUAL 1)
  message(FATAL_ERROR "expected one installed ferry.pc, found: ${pc_files}")
endif()
get_filename_component(pc_dir ${pc_files} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
foreach(var LD_LIBRARY_PATH FERRY_LIB_DIR FERRY_INCLUDE_DIR CARGO_TARGET_DIR RUSTFLAGS)
  unset(ENV{${var}})
endforeach()
if(LINKER)  # a sanitized libferry.so needs its runtime first (tests/rust's wrapper)
  set(ENV{RUSTFLAGS} "-C linker=${LINKER}")
endif()
execute_process(COMMAND ${CARGO} build --offline --quiet WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "examples/rust/guide did not build against ${PREFIX} (${rc})")
endif()
execute_process(COMMAND ${WORK_DIR}/target/debug/guide RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "guide (examples/rust/guide) failed (${rc}; 127 is the loader's: no libferry.so)")
endif()

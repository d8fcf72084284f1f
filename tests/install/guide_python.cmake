# cmake -P script: examples/python/guide.py run as docs/guide.md §10 says, with
# the package installed into PREFIX for PYTHON (where cmake/python_site_dir.py
# put it) and numpy hidden: `import ferry` and the guide need none.
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/cmake/python_site_dir.py ${PREFIX}
  OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake/python_site_dir.py failed")
endif()
string(REPLACE "\n" ";" site "${site}")
list(GET site 0 site_dir)
if(NOT EXISTS ${site_dir}/ferry/__init__.py)
  message(FATAL_ERROR "the install did not put the package at ${site_dir}/ferry")
endif()
set(ENV{PYTHONPATH} ${site_dir})
unset(ENV{FERRY_LIBRARY})
if(ASAN)  # a sanitized libferry.so in an unsanitized python
  set(ENV{LD_PRELOAD} ${ASAN})
  set(ENV{ASAN_OPTIONS} detect_leaks=0:protect_shadow_gap=0)
endif()
set(hide_numpy "import runpy, sys; sys.modules['numpy'] = None; import ferry; \
assert ferry.__file__.startswith(sys.argv[1]), ferry.__file__; \
runpy.run_path(sys.argv[2], run_name='__main__')")
execute_process(COMMAND ${PYTHON} -c "${hide_numpy}" ${site_dir} ${SOURCE_DIR}/examples/python/guide.py
  WORKING_DIRECTORY ${PREFIX} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "guide.py failed (${rc}) with the package from ${site_dir}")
endif()

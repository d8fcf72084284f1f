# Issue 3 benchmarks; bench/CMakeLists.txt includes this file after ferry_add_bench().
ferry_add_bench(transfer_bench ${CMAKE_CURRENT_LIST_DIR}/transfer_bench.cpp)

/* The C ABI fuzzer's launch function, in C: a C function may return any int as
 * a ferry_status, which C++ code cannot express without undefined behaviour.
 * The work itself is fuzz_launch_body (c_abi_fuzzer.cpp). */
#include "ferry/ferry.h"

int fuzz_launch_body(const ferry_launch_context* ctx, void* user_data);

ferry_status fuzz_launch(const ferry_launch_context* ctx, void* user_data) {
  return (ferry_status)fuzz_launch_body(ctx, user_data);
}

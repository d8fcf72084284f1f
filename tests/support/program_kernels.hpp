// A program's own kernels for the tests, on either backend: on sim they work on
// the operands' host views, on cuda they enqueue on the native stream. They stand
// for what an inference engine would launch (the cuda tests add a real __global__
// kernel of their own).
#pragma once

#include <cstddef>

#include "ferry/result.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry::testing {

// args[dst] := args[src] (same length).
Result<void> copy_operand(const KernelLaunch& launch, std::size_t dst, std::size_t src);
// Every byte of args[index] := value.
Result<void> set_operand(const KernelLaunch& launch, std::size_t index, unsigned char value);

}  // namespace ferry::testing

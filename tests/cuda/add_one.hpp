// A real __global__ kernel for the cuda tests (add_one.cu); 0 or a cudaError_t.
#pragma once

#include <cstddef>

int launch_add_one(void* bytes, std::size_t n, void* stream);

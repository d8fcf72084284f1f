// accumulate (accumulate.hpp) as ferry calls it, a user kernel (user_kernel.hpp):
// args[0] is acc (read-write), args[1] is w (read). The CUDA launch on a device,
// its host reference on the sim (no stream). Apart from accumulate.hpp, which
// nvcc compiles with accumulate.cu and which includes no ferry header.
#pragma once

#include "accumulate.hpp"
#include "ferry/user_kernel.hpp"

inline ferry::Result<void> accumulate_op(const ferry::KernelLaunch& l) {
  const ferry::KernelArg& acc = l.args[0];
  const ferry::KernelArg& w = l.args[1];
  if (l.stream == nullptr) {
    host_accumulate(acc.out, w.in);
    return {};
  }
  if (launch_accumulate(reinterpret_cast<void*>(acc.addr), reinterpret_cast<const void*>(w.addr), acc.bytes,
                        l.stream) != 0) {
    return ferry::make_error(ferry::ErrorCode::backend_error, "accumulate did not launch");
  }
  return {};
}

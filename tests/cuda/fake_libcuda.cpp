// A stand-in for the CUDA driver library, for driver_probe_test: cuInit answers what
// FERRY_FAKE_CUINIT says (a CUresult number; success when unset). Its soname is its own,
// so the CUDA runtime never takes it for the real driver.
#include <cstdlib>

extern "C" __attribute__((visibility("default"))) int cuInit(unsigned /*flags*/) {
  const char* v = std::getenv("FERRY_FAKE_CUINIT");
  return v != nullptr ? std::atoi(v) : 0;
}

/* ferry.h under clang's nullability checks (tests/capi/CMakeLists.txt): every
 * pointer of the header annotated (-Wnullability-completeness), and a NULL passed
 * where the header says FERRY_NONNULL is a compile error. Compiled, never run. */
#include "ferry/ferry.h"

int use_the_header(ferry_runtime rt);
int use_the_header(ferry_runtime rt) {
  ferry_handle h;
  ferry_pool_stats stats; /* the getter's macro passes sizeof stats */
  int failed = ferry_alloc(rt, 4096, 0, &h) != FERRY_OK;
  failed |= ferry_get_pool_stats(rt, &stats) != FERRY_OK;
  failed |= (ferry_get_pool_stats)(rt, &stats) != FERRY_OK; /* the unsized symbol */
  failed |= ferry_device_address(rt, h, NULL, NULL) != FERRY_OK; /* both outputs nullable */
#ifdef FERRY_PLANT_NULL
  failed |= ferry_get_pool_stats_sized(rt, NULL, sizeof stats) != FERRY_OK; /* out is FERRY_NONNULL */
#endif
  return failed;
}

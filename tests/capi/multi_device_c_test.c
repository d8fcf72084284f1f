/* Several devices through the C ABI, from C11, beyond device 0's calls: a
 * program's own stream adopted on device 1 (work ordered on it, refused by the
 * other device, released), and one offload cache across two devices (entries
 * placed round-robin or where there is room, an acquire on the other device
 * filled over an NVLink-class link or, without one, from the host; its figures). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "ferry/ferry.h"

enum { N = 96 * 1024, KEYS = 4 };

static ferry_runtime make(const char* links) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.device_count = 2;
  o.links = links;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  return rt;
}

/* Adds one to each byte of operand 0 (the sim hands the operands' bytes). */
static ferry_status plus_one(const ferry_launch_context* ctx, void* user_data) {
  (void)user_data;
  unsigned char* bytes = (unsigned char*)ctx->host_views[0];
  for (uint64_t i = 0; i < ctx->bytes[0]; ++i) bytes[i] = (unsigned char)(bytes[i] + 1);
  return FERRY_OK;
}

static void adopted_stream_on_device_1(void) {
  ferry_runtime rt = make(NULL);
  if (rt == NULL) return;
  int program_stream = 0;
  uint32_t s = 0;
  OK(ferry_device_adopt_stream(rt, 1, &program_stream, &s));
  CHECK(s >= 32);
  void* native = NULL;
  OK(ferry_device_native_stream(rt, 1, s, &native));
  CHECK(native == &program_stream);

  /* Work ordered on the adopted stream: upload, a launch, a download, in order. */
  static unsigned char src[N], back[N];
  for (int i = 0; i < N; ++i) src[i] = (unsigned char)(i * 11 + 2);
  ferry_handle h, other;
  OK(ferry_device_alloc(rt, 1, N, s, &h));
  OK(ferry_device_alloc(rt, 0, N, 0, &other));
  OK(ferry_device_upload(rt, s, h, 0, src, N));
  ferry_operand op = {h, 0, 0, FERRY_READ_WRITE};
  OK(ferry_device_launch(rt, 1, s, &op, 1, plus_one, NULL, 1e6, N));
  OK(ferry_device_download(rt, s, h, 0, back, N));
  int bumped = 1;
  for (int i = 0; i < N; ++i) bumped &= back[i] == (unsigned char)(src[i] + 1);
  CHECK(bumped);
  ferry_operand foreign = {other, 0, 0, FERRY_READ_WRITE};
  CHECK(ferry_device_launch(rt, 1, s, &foreign, 1, plus_one, NULL, 0, 0) == FERRY_ERROR_STALE_HANDLE);

  /* The other device refuses it: adopting the same native stream, releasing the id. */
  uint32_t s0 = 0;
  CHECK(ferry_device_adopt_stream(rt, 0, &program_stream, &s0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "adopted already on device 1") != NULL);
  CHECK(ferry_adopt_stream(rt, &program_stream, &s0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_release_stream(rt, 0, s, 1000) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "device 1's") != NULL);
  CHECK(ferry_release_stream(rt, s, 1000) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_release_stream(rt, 2, s, 1000) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "no device 2") != NULL);
  CHECK(ferry_device_adopt_stream(rt, 2, &program_stream, &s0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_adopt_stream(rt, 1, &program_stream, &s0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_adopt_stream(rt, 1, NULL, &s0) == FERRY_ERROR_INVALID_ARGUMENT);

  OK(ferry_device_free(rt, h));
  OK(ferry_device_free(rt, other));
  OK(ferry_device_release_stream(rt, 1, s, 1000));
  CHECK(ferry_device_release_stream(rt, 1, s, 1000) == FERRY_ERROR_INVALID_ARGUMENT);
  /* Released: device 0 may adopt it now, through either form. */
  OK(ferry_adopt_stream(rt, &program_stream, &s0));
  OK(ferry_device_release_stream(rt, 0, s0, 1000));
  ferry_runtime_destroy(rt);
}

static unsigned char pieces[KEYS][N];

static void define_keys(ferry_runtime rt) {
  for (int k = 0; k < KEYS; ++k) {
    for (int i = 0; i < N; ++i) pieces[k][i] = (unsigned char)(i * (k + 3) + k);
    const void* p = pieces[k];
    const uint64_t bytes = N;
    OK(ferry_multi_cache_define(rt, (uint64_t)k, &p, &bytes, 1));
  }
}

/* Acquires `key` on `device`, checks the slot is that device's and holds the
 * entry's bytes, releases it; *from_peer as the acquire said. */
static void acquire_checked(ferry_runtime rt, uint64_t key, uint32_t device, int* from_peer) {
  ferry_handle slot;
  uint64_t offset = 99;
  int hit = 1;
  OK(ferry_multi_cache_acquire(rt, key, device, 0, &slot, &offset, &hit, from_peer));
  CHECK(hit == 0 && offset == 0);
  uint32_t owner = 9;
  OK(ferry_device_of(rt, slot, &owner));
  CHECK(owner == device);
  static unsigned char back[N];
  memset(back, 0, N);
  OK(ferry_device_download(rt, 0, slot, 0, back, N));
  CHECK(memcmp(back, pieces[key], N) == 0);
  OK(ferry_multi_cache_release(rt, key, device));
}

static void one_cache_across_devices(void) {
  ferry_runtime rt = make("0-1:nvlink");
  if (rt == NULL) return;
  CHECK(ferry_multi_cache_define(rt, 0, NULL, NULL, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "ferry_multi_cache_create") != NULL);
  CHECK(ferry_multi_cache_create(rt, 2, 0, "nearest") == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_multi_cache_create(rt, 0, 0, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  OK(ferry_multi_cache_create(rt, 2, 0, "round_robin"));
  CHECK(ferry_multi_cache_create(rt, 2, 0, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  define_keys(rt);
  for (uint64_t k = 0; k < KEYS; ++k) {
    uint32_t device = 9;
    OK(ferry_multi_cache_placed(rt, k, &device));
    CHECK(device == k % 2);
  }
  uint32_t device = 0;
  CHECK(ferry_multi_cache_placed(rt, KEYS, &device) == FERRY_ERROR_INVALID_ARGUMENT);

  /* Key 0 from the host onto device 0, then onto device 1 over the link. */
  int from_peer = 1;
  acquire_checked(rt, 0, 0, &from_peer);
  CHECK(from_peer == 0);
  acquire_checked(rt, 0, 1, &from_peer);
  CHECK(from_peer == 1);
  ferry_handle slot;
  CHECK(ferry_multi_cache_acquire(rt, 0, 2, 0, &slot, NULL, NULL, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_multi_cache_release(rt, 0, 1) == FERRY_ERROR_INVALID_ARGUMENT); /* not pinned */

  ferry_multi_cache_stats m;
  OK(ferry_get_multi_cache_stats_sized(rt, &m, sizeof m));
  CHECK(m.struct_size == sizeof m);
  CHECK(m.peer_fills == 1 && m.host_fills == 1 && m.bytes_peer == N);
  ferry_cache_stats d0, d1;
  OK(ferry_get_multi_cache_device_stats_sized(rt, 0, &d0, sizeof d0));
  OK(ferry_get_multi_cache_device_stats_sized(rt, 1, &d1, sizeof d1));
  CHECK(d0.misses == 1 && d0.uploads == 1 && d0.bytes_uploaded == N);
  CHECK(d1.misses == 1 && d1.uploads == 0 && d1.bytes_uploaded == 0);
  CHECK(ferry_get_multi_cache_device_stats_sized(rt, 2, &d1, sizeof d1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_get_multi_cache_stats_sized(rt, &m, 12) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_struct_size("ferry_multi_cache_stats") == sizeof(ferry_multi_cache_stats));
  OK(ferry_synchronize(rt));
  ferry_runtime_destroy(rt);

  /* Without a link the other device's fill comes from the host. */
  rt = make(NULL);
  if (rt == NULL) return;
  OK(ferry_multi_cache_create(rt, 2, 0, NULL));
  define_keys(rt);
  acquire_checked(rt, 1, 1, &from_peer);
  CHECK(from_peer == 0);
  acquire_checked(rt, 1, 0, &from_peer);
  CHECK(from_peer == 0);
  OK(ferry_get_multi_cache_stats_sized(rt, &m, sizeof m));
  CHECK(m.peer_fills == 0 && m.host_fills == 2 && m.bytes_peer == 0);
  ferry_runtime_destroy(rt);

  /* most_room: key 0 pinned on device 0 sends key 1 to device 1. */
  rt = make(NULL);
  if (rt == NULL) return;
  OK(ferry_multi_cache_create(rt, 2, 0, "most_room"));
  define_keys(rt);
  OK(ferry_multi_cache_placed(rt, 0, &device));
  CHECK(device == 0);
  OK(ferry_multi_cache_acquire(rt, 0, device, 0, &slot, NULL, NULL, NULL));
  OK(ferry_multi_cache_placed(rt, 1, &device));
  CHECK(device == 1);
  OK(ferry_multi_cache_release(rt, 0, 0));
  ferry_runtime_destroy(rt);
}

int main(void) {
  adopted_stream_on_device_1();
  one_cache_across_devices();
  if (failures == 0) printf("multi_device_c_test: ok\n");
  return failures == 0 ? 0 : 1;
}

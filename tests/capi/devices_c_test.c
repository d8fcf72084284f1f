/* Several devices through the C ABI, from C11: the device count in the options
 * (an older caller's shorter struct still gets one device), handles of each device,
 * a handle of device 1 refused by device 0's calls, a stream of one device waiting
 * for another's, ferry_copy_peer verified, and links between devices: a linked
 * pair copies over its link (an injected peer-copy no-op shows through under "off"
 * and is caught under "verify"), and races that name each side's device. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "ferry/ferry.h"


enum { N = 16384 };

/* Copies N bytes from device 0 to device 1 of a runtime of two h200s joined by
 * NVLink whose peer copies are all swallowed; 1 when device 1 then holds them. */
static int peer_copy_lands(const char* integrity, int* verified) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.device_count = 2;
  o.capacity = 64u << 20;
  o.links = "0-1:nvlink";
  o.inject = "peer-noop";
  o.integrity = integrity;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  if (rt == NULL) return 0;
  static unsigned char src[N], back[N];
  for (int i = 0; i < N; ++i) src[i] = (unsigned char)(i * 5 + 1);
  ferry_handle a, b;
  OK(ferry_device_alloc(rt, 0, N, 1, &a));
  OK(ferry_device_alloc(rt, 1, N, 1, &b));
  OK(ferry_device_upload(rt, 1, a, 0, src, N));
  memset(back, 0, N);
  OK(ferry_device_upload(rt, 1, b, 0, back, N));
  OK(ferry_copy_peer(rt, b, 0, a, 0, N, 1, verified));
  OK(ferry_device_download(rt, 1, b, 0, back, N));
  const int landed = memcmp(src, back, N) == 0;
  OK(ferry_device_free(rt, a));
  OK(ferry_device_free(rt, b));
  ferry_runtime_destroy(rt);
  return landed;
}

/* Races across devices name each side's device: device 1's direct pull of `a`
 * (integrity off: nothing waits on the host for it) reads `a` on device 0, and a
 * write of `a` on another stream of device 0 races with it. The unsized
 * ferry_get_races symbol writes the first release's elements, nothing past them. */
static void races_name_their_devices(void) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.device_count = 2;
  o.links = "0-1:pcie";
  o.integrity = "off";
  o.race_check = 1;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  if (rt == NULL) return;
  static unsigned char bytes[N];
  ferry_handle a, b;
  OK(ferry_device_alloc(rt, 0, N, 1, &a));
  OK(ferry_device_alloc(rt, 1, N, 1, &b));
  OK(ferry_device_upload(rt, 1, a, 0, bytes, N));
  OK(ferry_synchronize(rt));
  OK(ferry_copy_peer(rt, b, 0, a, 0, N, 1, NULL));
  OK(ferry_device_upload(rt, 2, a, 0, bytes, N));
  OK(ferry_synchronize(rt));
  ferry_race races[4];
  uint32_t kept = 0;
  uint64_t total = 0;
  OK(ferry_get_races(rt, races, 4, &kept, &total));
  CHECK(kept >= 1 && total == kept);
  int across = 0;
  for (uint32_t i = 0; i < kept; ++i) {
    across |= races[i].earlier_device == 1 && strcmp(races[i].earlier.kind, "copy_peer") == 0 &&
              races[i].later_device == 0 && races[i].later.stream == 2;
  }
  CHECK(across);

  CHECK(FERRY_RACE_V1_SIZE < sizeof(ferry_race) && FERRY_RACE_V1_SIZE % 8 == 0);
  struct {
    unsigned char v1[2 * FERRY_RACE_V1_SIZE];
    unsigned char guard[64];
  } old;
  memset(old.guard, 0xAB, sizeof old.guard);
  uint32_t old_kept = 0;
  OK((ferry_get_races)(rt, (ferry_race*)(void*)old.v1, 2, &old_kept, NULL));
  CHECK(old_kept == (kept < 2 ? kept : 2));
  for (size_t i = 0; i < sizeof old.guard; ++i) CHECK(old.guard[i] == 0xAB);
  if (old_kept == 2) {
    ferry_race second;
    memcpy(&second, old.v1 + FERRY_RACE_V1_SIZE, FERRY_RACE_V1_SIZE);
    CHECK(second.bytes == races[1].bytes && second.later.ticket == races[1].later.ticket);
  }
  CHECK(ferry_get_races_sized(rt, races, 4, 12, NULL, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  OK(ferry_device_free(rt, a));
  OK(ferry_device_free(rt, b));
  ferry_runtime_destroy(rt);
}

static void links(void) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  CHECK(o.links == NULL);
  o.device_count = 3;
  o.links = " 0-1:nvlink , 2-1:pcie";
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  if (rt == NULL) return;
  const char* link = NULL;
  OK(ferry_device_link(rt, 1, 0, &link));
  CHECK(link != NULL && strcmp(link, "nvlink") == 0);
  OK(ferry_device_link(rt, 1, 2, &link));
  CHECK(link != NULL && strcmp(link, "pcie") == 0);
  OK(ferry_device_link(rt, 0, 2, &link));
  CHECK(link != NULL && strcmp(link, "none") == 0);
  CHECK(ferry_device_link(rt, 0, 3, &link) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_runtime_destroy(rt);

  /* Malformed or impossible links are refused, naming the pair. */
  const char* bad[] = {"0-1", "0:nvlink", "0-1:warp", "0-2:pcie", "1-1:pcie", "0-1:pcie,1-0:nvlink", "x-1:pcie"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    o.device_count = 2;
    o.links = bad[i];
    rt = NULL;
    CHECK(ferry_runtime_create(&o, &rt) == FERRY_ERROR_INVALID_ARGUMENT);
    CHECK(rt == NULL);
    CHECK(strstr(ferry_last_error(), "link") != NULL);
  }
  o.profile = "rtx4090"; /* no NVLink */
  o.links = "0-1:nvlink";
  CHECK(ferry_runtime_create(&o, &rt) == FERRY_ERROR_INVALID_ARGUMENT);

  /* Over the link the swallowed copy passes unverified and is caught under verify:
   * so a linked pair's copy took the link, not the host. */
  int verified = 1;
  CHECK(peer_copy_lands("off", &verified) == 0);
  CHECK(verified == 0);
  CHECK(peer_copy_lands("verify", &verified) == 1);
  CHECK(verified == 1);
}

/* Adds one to each byte of operand 0 (the sim hands the operands' bytes). */
static ferry_status plus_one(const ferry_launch_context* ctx, void* user_data) {
  (void)user_data;
  unsigned char* bytes = (unsigned char*)ctx->host_views[0];
  for (uint64_t i = 0; i < ctx->bytes[0]; ++i) bytes[i] = (unsigned char)(bytes[i] + 1);
  return FERRY_OK;
}

/* The stream calls and the figures of device 1: a held launch, record_use, its
 * own synchronize, native stream and stats; device 0's calls refuse its block. */
static void device_stream_calls(void) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.device_count = 2;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  if (rt == NULL) return;
  static unsigned char src[N], back[N];
  for (int i = 0; i < N; ++i) src[i] = (unsigned char)(i * 3);
  ferry_handle h;
  OK(ferry_device_alloc(rt, 1, N, 0, &h));
  ferry_integrity_stats e0, e1;
  OK(ferry_device_get_integrity_stats_sized(rt, 0, &e0, sizeof e0));
  OK(ferry_device_upload(rt, 0, h, 0, src, N));
  OK(ferry_device_get_integrity_stats_sized(rt, 1, &e1, sizeof e1));
  CHECK(e1.bytes_moved >= N);
  ferry_operand op = {h, 0, 0, FERRY_READ_WRITE};
  OK(ferry_device_hold(rt, 1, 0, 1));
  OK(ferry_device_launch(rt, 1, 0, &op, 1, plus_one, NULL, 1e6, N));
  OK(ferry_device_record_use(rt, 1, 0, &h, 1));
  OK(ferry_device_hold(rt, 1, 0, 0));
  OK(ferry_device_synchronize(rt, 1));
  OK(ferry_device_download(rt, 0, h, 0, back, N));
  int bumped = 1;
  for (int i = 0; i < N; ++i) bumped &= back[i] == (unsigned char)(src[i] + 1);
  CHECK(bumped);
  ferry_pool_stats p0, p1;
  OK(ferry_device_get_pool_stats_sized(rt, 0, &p0, sizeof p0));
  OK(ferry_device_get_pool_stats_sized(rt, 1, &p1, sizeof p1));
  CHECK(p1.allocs == 1 && p0.allocs == 0);
  ferry_integrity_stats after0;
  OK(ferry_device_get_integrity_stats_sized(rt, 0, &after0, sizeof after0));
  CHECK(after0.bytes_moved == e0.bytes_moved);
  void* native = NULL;
  OK(ferry_device_native_stream(rt, 1, 0, &native));
  CHECK(ferry_launch(rt, 0, &op, 1, plus_one, NULL, 0, 0) == FERRY_ERROR_STALE_HANDLE);
  CHECK(strstr(ferry_last_error(), "device 1") != NULL);
  CHECK(ferry_device_launch(rt, 2, 0, &op, 1, plus_one, NULL, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "no device 2") != NULL);
  CHECK(ferry_device_hold(rt, 2, 0, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_synchronize(rt, 2) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_get_pool_stats_sized(rt, 2, &p1, sizeof p1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_native_stream(rt, 1, 0, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  OK(ferry_device_free(rt, h));
  OK(ferry_device_synchronize(rt, 1));
  ferry_runtime_destroy(rt);
}

int main(void) {
  /* A caller built before device_count existed: one device. */
  ferry_runtime_options old;
  OK(ferry_runtime_options_init_sized(&old, offsetof(ferry_runtime_options, device_count)));
  old.profile = "tiny";
  ferry_runtime one = NULL;
  OK(ferry_runtime_create(&old, &one));
  uint32_t count = 0;
  OK(ferry_device_count(one, &count));
  CHECK(count == 1);
  ferry_runtime_destroy(one);

  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  CHECK(o.device_count == 0);
  o.profile = "tiny";
  o.device_count = 2;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  if (rt == NULL) return 1;
  OK(ferry_device_count(rt, &count));
  CHECK(count == 2);
  /* The recorder writes device 0's calls only: a trace of two devices is refused, not written short. */
  CHECK(ferry_trace_start(rt, "never-written-two-devices.jsonl") == FERRY_ERROR_UNSUPPORTED);
  CHECK(strstr(ferry_last_error(), "drives 2 devices") != NULL);
  CHECK(ferry_trace_stop(rt) == FERRY_ERROR_INVALID_ARGUMENT);

  ferry_handle a, b;
  OK(ferry_device_alloc(rt, 0, N, 1, &a));
  OK(ferry_device_alloc(rt, 1, N, 1, &b));
  CHECK(ferry_device_alloc(rt, 2, N, 1, &b) == FERRY_ERROR_INVALID_ARGUMENT);
  uint32_t device = 9;
  OK(ferry_device_of(rt, b, &device));
  CHECK(device == 1);

  static unsigned char src[N], back[N];
  for (int i = 0; i < N; ++i) src[i] = (unsigned char)(i * 7 + 3);
  OK(ferry_device_upload(rt, 1, a, 0, src, N));

  /* Device 0's own calls refuse device 1's handle, naming both devices. */
  CHECK(ferry_free(rt, b) == FERRY_ERROR_STALE_HANDLE);
  CHECK(strstr(ferry_last_error(), "device 1") != NULL);
  CHECK(strstr(ferry_last_error(), "device 0") != NULL);

  /* Device 1's stream 1 waits for device 0's stream 1 (the upload above), and
   * device 0's stream 2 for its own stream 1; bad devices and streams are refused. */
  OK(ferry_device_stream_wait(rt, 1, 1, 0, 1));
  OK(ferry_device_stream_wait(rt, 0, 2, 0, 1));
  CHECK(ferry_device_stream_wait(rt, 2, 1, 0, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "no device 2") != NULL);
  CHECK(ferry_device_stream_wait(rt, 1, 1, 3, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "no device 3") != NULL);
  CHECK(ferry_device_stream_wait(rt, 1, 1, 0, 64) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_stream_wait(rt, 1, 64, 0, 1) == FERRY_ERROR_INVALID_ARGUMENT);

  int verified = 0;
  OK(ferry_copy_peer(rt, b, 0, a, 0, N, 1, &verified));
  CHECK(verified == 1);
  OK(ferry_device_download(rt, 1, b, 0, back, N));
  CHECK(memcmp(src, back, N) == 0);
  CHECK(ferry_copy_peer(rt, b, 1, a, 0, N, 1, NULL) == FERRY_ERROR_INVALID_ARGUMENT);

  OK(ferry_device_free(rt, b));
  CHECK(ferry_device_free(rt, b) == FERRY_ERROR_STALE_HANDLE);
  CHECK(ferry_copy_peer(rt, b, 0, a, 0, N, 1, NULL) == FERRY_ERROR_STALE_HANDLE);
  OK(ferry_device_free(rt, a));
  OK(ferry_synchronize(rt));
  ferry_runtime_destroy(rt);
  links();
  races_name_their_devices();
  device_stream_calls();
  if (failures == 0) printf("devices_c_test: ok\n");
  return failures == 0 ? 0 : 1;
}

/* ferry_fill, ferry_compute and ferry_copy_to_host through the C ABI, from C
 * (compiled as C11), on the sim: their bytes against an uncaptured reference,
 * a graph capturing them with a launch replayed many times (each replay writes
 * the host buffers again), each call's refusals, and the trace lines they make. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "ferry/ferry.h"

enum { N = 4096, REPLAYS = 200 };

/* acc[i] += 1 + in[i]: operand 0 read, operand 1 read-write (host views on sim). */
static ferry_status accumulate(const ferry_launch_context* ctx, void* user_data) {
  (void)user_data;
  if (ctx->host_views == NULL || ctx->operand_count != 2) return FERRY_ERROR_UNSUPPORTED;
  const unsigned char* in = (const unsigned char*)ctx->host_views[0];
  unsigned char* acc = (unsigned char*)ctx->host_views[1];
  for (uint64_t i = 0; i < ctx->bytes[1]; ++i) acc[i] = (unsigned char)(acc[i] + 1 + in[i]);
  return FERRY_OK;
}

static ferry_runtime make(uint32_t devices) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.integrity = "off";
  o.capacity = 8u << 20;
  o.device_count = devices;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  return rt;
}

static int all_equal(const unsigned char* a, const unsigned char* b, size_t n) { return memcmp(a, b, n) == 0; }

/* The reference, uncaptured: fill is deterministic per seed, compute reads it,
 * copy_to_host writes the host bytes when the op completes (not at the call). */
static void reference(ferry_runtime rt, unsigned char* ref_b) {
  static unsigned char filled[N], again[N], other[N];
  ferry_handle a, a2, a3, b;
  OK(ferry_alloc(rt, N, 0, &a));
  OK(ferry_alloc(rt, N, 0, &a2));
  OK(ferry_alloc(rt, N, 0, &a3));
  OK(ferry_alloc(rt, N, 0, &b));
  OK(ferry_fill(rt, 0, a, 7));
  OK(ferry_fill(rt, 0, a2, 7));
  OK(ferry_fill(rt, 0, a3, 8));
  OK(ferry_compute(rt, 0, &a, 1, b, 1e6, N));
  memset(ref_b, 0xEE, N);
  OK(ferry_copy_to_host(rt, 0, b, ref_b, N));
  CHECK(ref_b[0] == 0xEE && ref_b[N - 1] == 0xEE); /* not yet: the sim's clock has not moved */
  OK(ferry_synchronize(rt));
  OK(ferry_download(rt, 0, a, 0, filled, N));
  OK(ferry_download(rt, 0, a2, 0, again, N));
  OK(ferry_download(rt, 0, a3, 0, other, N));
  CHECK(all_equal(filled, again, N));
  CHECK(!all_equal(filled, other, N));
  static unsigned char b_down[N];
  OK(ferry_download(rt, 0, b, 0, b_down, N));
  CHECK(all_equal(ref_b, b_down, N));
  CHECK(!all_equal(b_down, filled, N)); /* compute wrote something of its own */
  OK(ferry_free(rt, a));
  OK(ferry_free(rt, a2));
  OK(ferry_free(rt, a3));
  OK(ferry_free(rt, b));
}

/* fill -> compute -> launch -> copy_to_host, captured on stream 1, replayed. */
static void capture_and_replay(ferry_runtime rt, const unsigned char* ref_b) {
  static unsigned char zeros[N], host_acc[N], host_b[N], want[N];
  ferry_handle acc;
  OK(ferry_alloc(rt, N, 1, &acc));
  OK(ferry_upload(rt, 1, acc, 0, zeros, N));

  OK(ferry_begin_capture(rt, 1, NULL));
  ferry_handle a, b;
  OK(ferry_alloc(rt, N, 1, &a)); /* the graph's private pool */
  OK(ferry_alloc(rt, N, 1, &b));
  OK(ferry_fill(rt, 1, a, 7));
  OK(ferry_compute(rt, 1, &a, 1, b, 1e6, N));
  ferry_operand ops[2] = {{b, 0, 0, FERRY_READ}, {acc, 0, 0, FERRY_READ_WRITE}};
  OK(ferry_launch(rt, 1, ops, 2, accumulate, NULL, 0, 0));
  memset(host_acc, 0xEE, N);
  OK(ferry_copy_to_host(rt, 1, acc, host_acc, N));
  OK(ferry_copy_to_host(rt, 1, b, host_b, N));
  OK(ferry_free(rt, a));
  OK(ferry_free(rt, b));
  ferry_graph graph = NULL;
  OK(ferry_end_capture(rt, 1, &graph));
  CHECK(graph != NULL);
  OK(ferry_synchronize(rt));
  CHECK(host_acc[0] == 0xEE); /* recorded, not run */

  int right = 1;
  for (int k = 1; k <= REPLAYS && right; ++k) {
    memset(host_acc, 0xEE, N);
    memset(host_b, 0xEE, N);
    OK(ferry_graph_launch(rt, graph, 1));
    OK(ferry_synchronize(rt));
    for (int i = 0; i < N; ++i) want[i] = (unsigned char)(k * (1 + ref_b[i]));
    right = all_equal(host_b, ref_b, N) && all_equal(host_acc, want, N);
    if (!right) fprintf(stderr, "replay %d: wrong bytes\n", k);
  }
  CHECK(right);
  OK(ferry_graph_destroy(graph));
  OK(ferry_synchronize(rt));
  OK(ferry_free(rt, acc));
}

/* Each call's bad arguments: a status and a message, nothing enqueued. */
static void refusals(ferry_runtime rt) {
  static unsigned char host[N];
  ferry_handle h, dead, on1;
  OK(ferry_alloc(rt, N, 0, &h));
  OK(ferry_alloc(rt, N, 0, &dead));
  OK(ferry_free(rt, dead));
  OK(ferry_device_alloc(rt, 1, N, 0, &on1));

  CHECK(ferry_fill(NULL, 0, h, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "ferry_fill: rt is NULL") != NULL);
  CHECK(ferry_fill(rt, 64, h, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_fill(rt, 0, dead, 1) == FERRY_ERROR_STALE_HANDLE);
  CHECK(ferry_fill(rt, 0, on1, 1) == FERRY_ERROR_STALE_HANDLE); /* device 1's block */
  CHECK(ferry_device_fill(rt, 2, 0, on1, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_fill(rt, 0, 0, on1, 1) == FERRY_ERROR_STALE_HANDLE);

  CHECK(ferry_compute(NULL, 0, &h, 1, h, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_compute(rt, 0, NULL, 1, h, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "inputs is NULL") != NULL);
  CHECK(ferry_compute(rt, 64, &h, 1, h, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_compute(rt, 0, &dead, 1, h, 0, 0) == FERRY_ERROR_STALE_HANDLE);
  CHECK(ferry_compute(rt, 0, &h, 1, dead, 0, 0) == FERRY_ERROR_STALE_HANDLE);
  CHECK(ferry_device_compute(rt, 2, 0, &on1, 1, on1, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_compute(rt, 1, 0, &h, 1, on1, 0, 0) == FERRY_ERROR_STALE_HANDLE);

  CHECK(ferry_copy_to_host(NULL, 0, h, host, N) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_copy_to_host(rt, 0, h, NULL, N) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "dst is NULL") != NULL);
  CHECK(ferry_copy_to_host(rt, 0, h, host, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_copy_to_host(rt, 0, h, host, N - 1) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "dst holds 4095 bytes, the block 4096") != NULL);
  CHECK(ferry_copy_to_host(rt, 64, h, host, N) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_copy_to_host(rt, 0, dead, host, N) == FERRY_ERROR_STALE_HANDLE);
  CHECK(ferry_device_copy_to_host(rt, 2, 0, on1, host, N) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_device_copy_to_host(rt, 1, 0, on1, NULL, N) == FERRY_ERROR_INVALID_ARGUMENT);

  /* Device 1's forms run there: fill then copy back. */
  static unsigned char from1[N], down1[N];
  OK(ferry_device_fill(rt, 1, 0, on1, 9));
  OK(ferry_device_compute(rt, 1, 0, &on1, 1, on1, 0, 0));
  OK(ferry_device_copy_to_host(rt, 1, 0, on1, from1, N));
  OK(ferry_device_synchronize(rt, 1));
  OK(ferry_device_download(rt, 0, on1, 0, down1, N));
  CHECK(all_equal(from1, down1, N));

  OK(ferry_free(rt, h));
  OK(ferry_device_free(rt, on1));
  OK(ferry_synchronize(rt));
}

/* The trace writes them as the replay format's fill, compute and check lines
 * (on a runtime of one device: ferry_trace_start refuses several). */
static void traced(ferry_runtime rt, const char* path) {
  static unsigned char host[N];
  ferry_handle a, b;
  OK(ferry_trace_start(rt, path));
  OK(ferry_alloc(rt, N, 0, &a));
  OK(ferry_alloc(rt, N, 0, &b));
  OK(ferry_fill(rt, 0, a, 3));
  OK(ferry_compute(rt, 0, &a, 1, b, 0, 0));
  OK(ferry_copy_to_host(rt, 0, b, host, N));
  OK(ferry_synchronize(rt));
  OK(ferry_free(rt, a));
  OK(ferry_free(rt, b));
  OK(ferry_trace_stop(rt));
  FILE* f = fopen(path, "r");
  CHECK(f != NULL);
  int fills = 0, computes = 0, checks = 0;
  char line[1024];
  while (f != NULL && fgets(line, sizeof line, f) != NULL) {
    fills += strstr(line, "\"op\":\"fill\"") != NULL;
    computes += strstr(line, "\"op\":\"compute\"") != NULL;
    checks += strstr(line, "\"op\":\"check\"") != NULL;
  }
  if (f != NULL) fclose(f);
  CHECK(fills == 1 && computes == 1 && checks == 1);
}

int main(int argc, char** argv) {
  ferry_runtime rt = make(2);
  if (rt == NULL) return 1;
  static unsigned char ref_b[N];
  reference(rt, ref_b);
  capture_and_replay(rt, ref_b);
  refusals(rt);
  ferry_runtime_destroy(rt);
  ferry_runtime one = make(1);
  if (one == NULL) return 1;
  traced(one, argc > 1 ? argv[1] : "device_work_c_test.trace.jsonl");
  ferry_runtime_destroy(one);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  puts("device work C ABI: ok");
  return 0;
}

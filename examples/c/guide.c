/* docs/guide.md §9: ferry from C, start to end, on the sim. Build it against an
 * installed ferry (guide §9 says where pkg-config looks):
 *     cc -std=c11 guide.c $(pkg-config --cflags --libs ferry) -o guide && ./guide
 * Exit status 0 when every check passed, 1 with the failing call's message. */
#include <ferry/ferry.h>
#include <stdio.h>
#include <stdlib.h>

enum { N = 64 * 1024 };

/* Your kernel: out = in + 1, byte by byte. On the sim it computes on the
 * operands' bytes; on cuda (host_views NULL) you would launch your own kernel on
 * ctx->native_stream over ctx->device_addresses. */
static ferry_status plus_one(const ferry_launch_context* ctx, void* user_data) {
  (void)user_data;
  if (ctx->host_views == NULL) return FERRY_ERROR_UNSUPPORTED;
  const unsigned char* in = ctx->host_views[0];
  unsigned char* out = ctx->host_views[1];
  for (uint64_t i = 0; i < ctx->bytes[1]; ++i) out[i] = (unsigned char)(in[i] + 1);
  return FERRY_OK;
}

static int failed(const char* what) {
  fprintf(stderr, "guide: %s failed: %s\n", what, ferry_last_error());
  return 1;
}

static int run(ferry_runtime rt, unsigned char* host) {
  ferry_handle a, b;
  if (ferry_alloc(rt, N, 0, &a) != FERRY_OK) return failed("ferry_alloc a");
  if (ferry_alloc(rt, N, 0, &b) != FERRY_OK) return failed("ferry_alloc b");
  for (int i = 0; i < N; ++i) host[i] = (unsigned char)(i * 7);
  if (ferry_upload(rt, 0, a, 0, host, N) != FERRY_OK) return failed("ferry_upload"); /* verified */

  /* Hold stream 0 so the launch is still pending when `a` is freed: the launch
   * leases its operands, so the free is legal and `a` stays intact until it ran. */
  if (ferry_hold(rt, 0, 1) != FERRY_OK) return failed("ferry_hold");
  const ferry_operand ops[2] = {{a, 0, 0, FERRY_READ}, {b, 0, 0, FERRY_WRITE}};
  if (ferry_launch(rt, 0, ops, 2, plus_one, NULL, 0, 0) != FERRY_OK) return failed("ferry_launch");
  if (ferry_free(rt, a) != FERRY_OK) return failed("ferry_free a");
  if (ferry_hold(rt, 0, 0) != FERRY_OK) return failed("ferry_hold release");

  if (ferry_download(rt, 0, b, 0, host, N) != FERRY_OK) return failed("ferry_download");
  for (int i = 0; i < N; ++i) {
    if (host[i] != (unsigned char)(i * 7 + 1)) {
      fprintf(stderr, "guide: byte %d of b is %u, expected %u\n", i, host[i], (unsigned char)(i * 7 + 1));
      return 1;
    }
  }
  printf("downloaded %d bytes of b, each one more than a's\n", N);

  if (ferry_download(rt, 0, a, 0, host, N) != FERRY_ERROR_STALE_HANDLE) {
    fprintf(stderr, "guide: a freed handle was not refused\n");
    return 1;
  }
  printf("the freed handle is refused: %s\n", ferry_last_error());

  ferry_pool_stats stats;
  if (ferry_get_pool_stats(rt, &stats) != FERRY_OK) return failed("ferry_get_pool_stats");
  printf("allocs %llu, frees %llu (ferry's own buffers: internal_allocs %llu, internal_frees %llu)\n",
         (unsigned long long)stats.allocs, (unsigned long long)stats.frees,
         (unsigned long long)stats.internal_allocs, (unsigned long long)stats.internal_frees);
  if (stats.allocs != 2 || stats.frees != 1) {
    fprintf(stderr, "guide: expected 2 allocs and 1 free\n");
    return 1;
  }
  size_t length = 0;
  if (ferry_memory_summary(rt, NULL, 0, &length) != FERRY_OK) return failed("ferry_memory_summary");
  char* summary = malloc(length + 1);
  if (summary == NULL) return 1;
  if (ferry_memory_summary(rt, summary, length + 1, NULL) != FERRY_OK) {
    free(summary);
    return failed("ferry_memory_summary");
  }
  fputs(summary, stdout);
  free(summary);
  if (ferry_free(rt, b) != FERRY_OK) return failed("ferry_free b");
  return 0;
}

int main(void) {
  ferry_runtime_options options;
  ferry_runtime_options_init(&options); /* the sim modelling an H200, verified uploads */
  ferry_runtime rt;
  if (ferry_runtime_create(&options, &rt) != FERRY_OK) return failed("ferry_runtime_create");
  unsigned char* host = malloc(N);
  const int status = host == NULL ? 1 : run(rt, host);
  free(host);
  ferry_runtime_destroy(rt); /* waits for the runtime's work, then frees everything */
  if (status == 0) printf("guide: ok\n");
  return status;
}

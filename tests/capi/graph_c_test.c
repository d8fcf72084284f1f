/* Graph capture through the C ABI, from C (compiled as C11), on the sim: a
 * captured kernel replayed many times, a block freed inside the capture kept by
 * the graph, a refused call spoiling the capture, a replay over a block freed
 * outside the graph refused. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "ferry/ferry.h"


/* Every byte of the last operand += 1 + every byte of the others (host views on sim). */
static ferry_status add_one(const ferry_launch_context* ctx, void* user_data) {
  (void)user_data;
  if (ctx->host_views == NULL || ctx->operand_count == 0) return FERRY_ERROR_UNSUPPORTED;
  const uint32_t last = ctx->operand_count - 1;
  unsigned char* out = (unsigned char*)ctx->host_views[last];
  for (uint64_t i = 0; i < ctx->bytes[last]; ++i) {
    unsigned char v = (unsigned char)(out[i] + 1);
    for (uint32_t k = 0; k < last; ++k) v = (unsigned char)(v + ((const unsigned char*)ctx->host_views[k])[i]);
    out[i] = v;
  }
  return FERRY_OK;
}

int main(void) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.integrity = "off";
  o.capacity = 8u << 20;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  if (rt == NULL) return 1;

  enum { N = 1024, REPLAYS = 1000 };
  unsigned char zeros[N], got[N];
  memset(zeros, 0, sizeof zeros);
  ferry_handle acc;
  OK(ferry_alloc(rt, N, 1, &acc));
  OK(ferry_upload(rt, 1, acc, 0, zeros, N));

  /* tmp is the graph's: zeroed, bumped, added into acc, freed, all recorded. */
  OK(ferry_begin_capture(rt, 1, NULL));
  ferry_handle tmp;
  OK(ferry_alloc(rt, N, 1, &tmp));
  OK(ferry_upload(rt, 1, tmp, 0, zeros, N));
  ferry_operand on_tmp[1] = {{tmp, 0, 0, FERRY_READ_WRITE}};
  OK(ferry_launch(rt, 1, on_tmp, 1, add_one, NULL, 0, 0));
  ferry_operand into_acc[2] = {{tmp, 0, 0, FERRY_READ}, {acc, 0, 0, FERRY_READ_WRITE}};
  OK(ferry_launch(rt, 1, into_acc, 2, add_one, NULL, 0, 0));
  OK(ferry_free(rt, tmp));
  ferry_graph graph = NULL;
  OK(ferry_end_capture(rt, 1, &graph));
  CHECK(graph != NULL);

  /* Nothing ran yet. */
  OK(ferry_download(rt, 1, acc, 0, got, N));
  CHECK(got[0] == 0 && got[N - 1] == 0);

  for (int i = 0; i < REPLAYS; ++i) OK(ferry_graph_launch(rt, graph, 1));
  OK(ferry_download(rt, 1, acc, 0, got, N));
  int right = 1;
  for (int i = 0; i < N; ++i) right = right && got[i] == (unsigned char)(2 * REPLAYS);
  CHECK(right);

  /* A refused call spoils its capture and says why. */
  OK(ferry_begin_capture(rt, 2, graph));
  CHECK(ferry_download(rt, 2, acc, 0, got, N) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "capturing stream 2") != NULL);
  ferry_graph spoiled = graph;
  CHECK(ferry_end_capture(rt, 2, &spoiled) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(spoiled == NULL);
  CHECK(strstr(ferry_last_error(), "spoiled") != NULL);

  /* Misuse is a status. */
  CHECK(ferry_end_capture(rt, 3, &spoiled) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_begin_capture(rt, 4096, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_graph_launch(rt, graph, 4096) == FERRY_ERROR_INVALID_ARGUMENT);
  OK(ferry_graph_destroy(NULL));

  /* A block of the graph freed outside it: the replay is refused, nothing runs. */
  OK(ferry_free(rt, acc));
  CHECK(ferry_graph_launch(rt, graph, 1) == FERRY_ERROR_STALE_HANDLE);
  CHECK(strstr(ferry_last_error(), "freed outside") != NULL);
  OK(ferry_graph_destroy(graph));
  OK(ferry_synchronize(rt));
  ferry_runtime_destroy(rt);

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  puts("graph C ABI: ok");
  return 0;
}

/* The C ABI from C (compiled as C11): every entry point on the sim, its errors as
 * statuses with messages, nothing crashing on bad input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "ferry/ferry.h"


static ferry_runtime make(const char* profile, const char* inject, const char* integrity, uint32_t cache_slots) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = profile;
  o.inject = inject;
  o.integrity = integrity;
  o.capacity = 8u << 20;
  o.cache_slots = cache_slots;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  return rt;
}

/* A kernel: every byte of operand 1 := operand 0's byte + 1 (host views on sim). */
static ferry_status plus_one(const ferry_launch_context* ctx, void* user_data) {
  int* calls = (int*)user_data;
  ++*calls;
  if (ctx->host_views == NULL || ctx->operand_count != 2) return FERRY_ERROR_UNSUPPORTED;
  const unsigned char* in = (const unsigned char*)ctx->host_views[0];
  unsigned char* out = (unsigned char*)ctx->host_views[1];
  for (uint64_t i = 0; i < ctx->bytes[1]; ++i) out[i] = (unsigned char)(in[i] + 1);
  return FERRY_OK;
}

static ferry_status refuses(const ferry_launch_context* ctx, void* user_data) {
  (void)ctx;
  (void)user_data;
  return FERRY_ERROR_TRANSFER_CORRUPT;
}

/* A C function may return any int as a status; ferry reads it as an int, never as
 * a C++ enum outside its range (UBSan, fuzz/c_abi_fuzzer.cpp). */
static ferry_status returns_no_status(const ferry_launch_context* ctx, void* user_data) {
  (void)ctx;
  (void)user_data;
  return (ferry_status)42;
}

static ferry_status refuses_nothing(const ferry_launch_context* ctx, void* user_data) {
  (void)ctx;
  ++*(int*)user_data;
  return FERRY_OK;
}

static void test_basics(void) {
  /* One version: CMakeLists.txt's project(VERSION), through the configured header
   * into the macros and into the library. */
  char from_macros[32];
  snprintf(from_macros, sizeof from_macros, "%d.%d.%d", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR,
           FERRY_VERSION_PATCH);
  CHECK(strcmp(FERRY_VERSION_STRING, FERRY_PROJECT_VERSION) == 0);
  CHECK(strcmp(from_macros, FERRY_PROJECT_VERSION) == 0);
  CHECK(strcmp(ferry_version(), FERRY_PROJECT_VERSION) == 0);
  CHECK(strcmp(ferry_status_name(FERRY_ERROR_STALE_HANDLE), "stale_handle") == 0);
  CHECK(strcmp(ferry_status_name((ferry_status)99), "unknown") == 0);
  ferry_runtime_destroy(NULL);

  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.backend = "tpu";
  ferry_runtime rt = NULL;
  CHECK(ferry_runtime_create(&o, &rt) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(rt == NULL);
  CHECK(strstr(ferry_last_error(), "tpu") != NULL);
  ferry_runtime_options_init(&o);
  o.integrity = "sometimes";
  CHECK(ferry_runtime_create(&o, &rt) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_runtime_create(&o, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  OK(ferry_runtime_create(NULL, &rt)); /* the defaults: sim, h200 */
  ferry_runtime_destroy(rt);
}

static void test_memory_and_transfers(void) {
  ferry_runtime rt = make("tiny", NULL, NULL, 0);
  ferry_handle h, out;
  OK(ferry_alloc(rt, 4096, 0, &h));
  CHECK(ferry_alloc(rt, 0, 0, &out) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_alloc(rt, 4096, 64, &out) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_alloc(rt, 4096, 0, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_status huge = ferry_alloc(rt, (uint64_t)1 << 63, 0, &out);
  CHECK(huge == FERRY_ERROR_OUT_OF_MEMORY || huge == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_alloc(rt, 64u << 20, 0, &out) == FERRY_ERROR_OUT_OF_MEMORY);
  CHECK(strstr(ferry_last_error(), "capacity") != NULL); /* the pool's diagnostic */

  uint64_t addr = 0, bytes = 0;
  OK(ferry_device_address(rt, h, &addr, &bytes));
  CHECK(addr != 0 && bytes == 4096);
  OK(ferry_device_address(rt, h, NULL, NULL));

  unsigned char src[4096], dst[4096];
  for (int i = 0; i < 4096; ++i) src[i] = (unsigned char)(i * 31);
  OK(ferry_upload(rt, 1, h, 0, src, sizeof src));
  OK(ferry_download(rt, 0, h, 0, dst, sizeof dst));
  CHECK(memcmp(src, dst, sizeof src) == 0);
  CHECK(ferry_upload(rt, 1, h, 0, NULL, 16) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_upload(rt, 1, h, 4000, src, 200) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_download(rt, 0, h, 0, dst, 0) == FERRY_ERROR_INVALID_ARGUMENT);

  ferry_pool_stats ps; /* as the first release's guide: nothing set */
  OK(ferry_get_pool_stats(rt, &ps));
  CHECK(ps.allocs >= 1 && ps.allocated_bytes >= 4096 && ps.ooms >= 1);
  ferry_integrity_stats is;
  OK(ferry_get_integrity_stats(rt, &is));
  CHECK(is.bytes_verified >= 4096);

  size_t length = 0;
  OK(ferry_memory_summary(rt, NULL, 0, &length));
  CHECK(length > 0);
  char* text = (char*)malloc(length + 1);
  OK(ferry_memory_summary(rt, text, length + 1, NULL));
  CHECK(strlen(text) == length);
  free(text);

  OK(ferry_free(rt, h));
  CHECK(ferry_free(rt, h) == FERRY_ERROR_STALE_HANDLE);
  ferry_handle forged = {h.pool, h.slot, h.generation + 5};
  CHECK(ferry_device_address(rt, forged, &addr, &bytes) == FERRY_ERROR_STALE_HANDLE);
  OK(ferry_trim(rt));
  OK(ferry_synchronize(rt));
  ferry_runtime_destroy(rt);
}

static void test_launch_hold_record_use(void) {
  ferry_runtime rt = make("tiny", NULL, NULL, 0);
  ferry_handle a, b;
  OK(ferry_alloc(rt, 1024, 0, &a));
  OK(ferry_alloc(rt, 1024, 0, &b));
  unsigned char src[1024], dst[1024];
  for (int i = 0; i < 1024; ++i) src[i] = (unsigned char)i;
  OK(ferry_upload(rt, 0, a, 0, src, sizeof src));

  int calls = 0;
  OK(ferry_hold(rt, 0, 1));
  ferry_operand ops[2] = {{a, 0, 0, FERRY_READ}, {b, 0, 0, FERRY_WRITE}};
  OK(ferry_launch(rt, 0, ops, 2, plus_one, &calls, 0, 0));
  OK(ferry_free(rt, a)); /* legal: the held launch holds it */
  CHECK(calls == 0);
  OK(ferry_hold(rt, 0, 0));
  OK(ferry_download(rt, 0, b, 0, dst, sizeof dst));
  CHECK(calls == 1);
  int right = 1;
  for (int i = 0; i < 1024; ++i) right = right && dst[i] == (unsigned char)(i + 1);
  CHECK(right);

  ferry_operand bad[1] = {{b, 0, 0, 7}};
  CHECK(ferry_launch(rt, 0, bad, 1, plus_one, &calls, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_launch(rt, 0, ops, 2, plus_one, &calls, 0, 0) == FERRY_ERROR_STALE_HANDLE); /* a is freed */
  CHECK(ferry_launch(rt, 0, ops + 1, 1, NULL, NULL, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ferry_launch(rt, 0, NULL, 1, plus_one, NULL, 0, 0) == FERRY_ERROR_INVALID_ARGUMENT);

  /* A failing launch is the op's error and a sticky fault of its stream. */
  OK(ferry_launch(rt, 2, ops + 1, 1, refuses, NULL, 0, 0));
  CHECK(ferry_synchronize(rt) == FERRY_ERROR_TRANSFER_CORRUPT);

  ferry_runtime other = make("tiny", NULL, NULL, 0);
  ferry_handle c;
  OK(ferry_alloc(other, 256, 0, &c));
  ferry_operand on_c[1] = {{c, 0, 0, FERRY_WRITE}};
  OK(ferry_launch(other, 0, on_c, 1, returns_no_status, NULL, 0, 0));
  CHECK(ferry_synchronize(other) == FERRY_ERROR_BACKEND);
  CHECK(strstr(ferry_last_error(), "returned unknown (42)") != NULL);
  ferry_runtime_destroy(other);
  CHECK(strcmp(ferry_status_name((ferry_status)-1), "unknown") == 0);

  ferry_handle used[1] = {b};
  OK(ferry_record_use(rt, 3, used, 1));
  ferry_handle stale[1] = {a};
  CHECK(ferry_record_use(rt, 3, stale, 1) == FERRY_ERROR_STALE_HANDLE);
  CHECK(ferry_record_use(rt, 3, NULL, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  OK(ferry_record_use(rt, 3, NULL, 0));
  CHECK(ferry_hold(rt, 64, 1) == FERRY_ERROR_INVALID_ARGUMENT);

  int program_stream = 0;
  uint32_t s = 0;
  OK(ferry_adopt_stream(rt, &program_stream, &s));
  CHECK(s >= 32);
  void* native = NULL;
  OK(ferry_native_stream(rt, s, &native));
  CHECK(native == &program_stream);
  OK(ferry_release_stream(rt, s, 1000));
  CHECK(ferry_release_stream(rt, s, 1000) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_runtime_destroy(rt);
}

/* Report 000: a copy out of churned pinned memory silently does nothing. */
static void test_integrity(void) {
  ferry_runtime rt = make("tiny", "pinned-noop", "verify", 0);
  ferry_handle h;
  OK(ferry_alloc(rt, 1u << 20, 0, &h));
  unsigned char* src = (unsigned char*)malloc(1u << 20);
  unsigned char* dst = (unsigned char*)malloc(1u << 20);
  for (int round = 0; round < 4; ++round) {
    for (uint32_t i = 0; i < (1u << 20); ++i) src[i] = (unsigned char)(i * 7 + round);
    OK(ferry_upload(rt, 1, h, 0, src, 1u << 20));
    OK(ferry_download(rt, 0, h, 0, dst, 1u << 20));
    CHECK(memcmp(src, dst, 1u << 20) == 0);
  }
  free(src);
  free(dst);
  ferry_runtime_destroy(rt);
}

static void test_cache_and_trace(const char* trace_path) {
  ferry_runtime rt = make("tiny", NULL, NULL, 2);
  static unsigned char expert[3][4096];
  for (int e = 0; e < 3; ++e) memset(expert[e], e + 1, sizeof expert[e]);
  for (uint64_t e = 0; e < 3; ++e) {
    const void* pieces[2] = {expert[e], expert[e] + 1024};
    const uint64_t sizes[2] = {1024, 3072};
    OK(ferry_cache_define(rt, e, pieces, sizes, 2));
  }
  ferry_handle slot;
  uint64_t offsets[2];
  int hit = -1;
  OK(ferry_cache_acquire(rt, 1, 0, &slot, offsets, &hit));
  CHECK(hit == 0 && offsets[0] == 0);
  unsigned char back[4096];
  OK(ferry_download(rt, 0, slot, 0, back, sizeof back));
  CHECK(memcmp(back, expert[1], sizeof back) == 0);
  OK(ferry_cache_release(rt, 1));
  OK(ferry_cache_acquire(rt, 1, 0, &slot, NULL, &hit));
  CHECK(hit == 1);
  OK(ferry_cache_release(rt, 1));
  CHECK(ferry_cache_release(rt, 1) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_cache_stats cs;
  OK(ferry_get_cache_stats(rt, &cs));
  CHECK(cs.hits == 1 && cs.misses == 1 && cs.uploads == 1);

  OK(ferry_trace_start(rt, trace_path));
  CHECK(ferry_trace_start(rt, trace_path) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_handle t;
  OK(ferry_alloc(rt, 4096, 0, &t));
  OK(ferry_upload(rt, 0, t, 0, expert[0], 4096));
  OK(ferry_download(rt, 0, t, 0, back, 4096));
  OK(ferry_free(rt, t));
  OK(ferry_trace_stop(rt));
  CHECK(ferry_trace_stop(rt) == FERRY_ERROR_INVALID_ARGUMENT);
  FILE* f = fopen(trace_path, "r");
  CHECK(f != NULL);
  int lines = 0;
  char line[512];
  while (f != NULL && fgets(line, sizeof line, f) != NULL) ++lines;
  if (f != NULL) fclose(f);
  CHECK(lines == 6); /* meta (the capacity), the cache slot's alloc (live before: "existing"), alloc, upload,
                        check, free */
  ferry_runtime_destroy(rt);

  ferry_runtime no_cache = make("tiny", NULL, NULL, 0);
  CHECK(ferry_cache_acquire(no_cache, 0, 0, &slot, NULL, NULL) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_runtime_destroy(no_cache);
}

/* Two streams fill one block with nothing between them: a write/write race. */
static void test_races(void) {
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.race_check = 1;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create(&o, &rt));
  ferry_handle h;
  OK(ferry_alloc(rt, 4096, 0, &h));
  OK(ferry_set_tag(rt, h, "kv"));
  ferry_handle forged = h;
  forged.generation += 1;
  CHECK(ferry_set_tag(rt, forged, "x") == FERRY_ERROR_STALE_HANDLE);
  int calls = 0;
  ferry_operand w[1] = {{h, 0, 0, FERRY_WRITE}};
  OK(ferry_launch(rt, 0, w, 1, refuses_nothing, &calls, 0, 0));
  OK(ferry_launch(rt, 1, w, 1, refuses_nothing, &calls, 0, 0));
  OK(ferry_synchronize(rt));
  ferry_race races[4];
  uint32_t kept = 0;
  uint64_t total = 0;
  OK(ferry_get_races(rt, races, 4, &kept, &total));
  CHECK(total == 1 && kept == 1);
  CHECK(races[0].earlier.stream == 0 && races[0].later.stream == 1);
  CHECK(strcmp(races[0].later.kind, "user") == 0 && races[0].later.access == FERRY_WRITE);
  CHECK(races[0].bytes == 4096);
  CHECK(races[0].later.block.slot == h.slot && races[0].later.block.generation == h.generation);
  CHECK(strcmp(races[0].earlier.block_tag, "kv") == 0 && races[0].reuse == 0);
  /* Ordered by a stream wait: no new race. */
  OK(ferry_launch(rt, 0, w, 1, refuses_nothing, &calls, 0, 0));
  OK(ferry_stream_wait(rt, 1, 0));
  OK(ferry_launch(rt, 1, w, 1, refuses_nothing, &calls, 0, 0));
  OK(ferry_synchronize(rt));
  OK(ferry_get_races(rt, races, 4, &kept, &total));
  CHECK(total == 1);
  CHECK(ferry_stream_wait(rt, 64, 0) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_runtime_destroy(rt);

  ferry_runtime plain = make("tiny", NULL, NULL, 0);
  CHECK(ferry_get_races(plain, NULL, 0, NULL, NULL) == FERRY_ERROR_UNSUPPORTED);
  ferry_runtime_destroy(plain);
}

/* The first release's structs, as a program compiled against that header lays
 * them out: the prefixes of today's, without the fields added since. */
typedef struct v1_runtime_options {
  size_t struct_size;
  const char* backend;
  const char* profile;
  uint64_t capacity;
  uint64_t seed;
  const char* integrity;
  const char* inject;
  uint32_t cache_slots;
  uint64_t cache_slot_bytes;
} v1_runtime_options;
typedef struct v1_pool_stats {
  size_t struct_size;
  uint64_t allocated_bytes, peak_allocated_bytes, reserved_bytes, peak_reserved_bytes, pending_free_bytes, allocs,
      frees, ooms, reclaims;
} v1_pool_stats;

/* An old caller keeps working against this library: it reads and writes only the
 * prefix the caller has. */
static void test_old_caller(void) {
  CHECK(sizeof(v1_runtime_options) == FERRY_RUNTIME_OPTIONS_V1_SIZE);
  CHECK(sizeof(v1_pool_stats) == FERRY_POOL_STATS_V1_SIZE);
  CHECK(sizeof(v1_runtime_options) < sizeof(ferry_runtime_options));
  CHECK(sizeof(v1_pool_stats) < sizeof(ferry_pool_stats));

  /* Guarded on both sides: init and the getter must not write past the prefix. */
  struct {
    v1_runtime_options o;
    unsigned char guard[64];
  } opt;
  memset(opt.guard, 0xAB, sizeof opt.guard);
  OK(ferry_runtime_options_init_sized((ferry_runtime_options*)&opt.o, sizeof opt.o));
  CHECK(opt.o.struct_size == sizeof opt.o && opt.o.seed == 1 && opt.o.backend == NULL);
  for (size_t i = 0; i < sizeof opt.guard; ++i) CHECK(opt.guard[i] == 0xAB);
  opt.o.profile = "tiny";
  opt.o.capacity = 8u << 20;
  ferry_runtime rt = NULL;
  OK(ferry_runtime_create((const ferry_runtime_options*)&opt.o, &rt));
  CHECK(rt != NULL);
  ferry_handle h;
  OK(ferry_alloc(rt, 4096, 0, &h));
  CHECK(ferry_get_races(rt, NULL, 0, NULL, NULL) == FERRY_ERROR_UNSUPPORTED); /* race_check: its default */

  struct {
    v1_pool_stats s;
    unsigned char guard[64];
  } st;
  /* Its ferry_get_pool_stats(rt, &s) macro passed its own sizeof. */
  memset(&st, 0xAB, sizeof st);
  OK(ferry_get_pool_stats_sized(rt, (ferry_pool_stats*)&st.s, sizeof st.s));
  CHECK(st.s.struct_size == sizeof st.s && st.s.allocs == 1 && st.s.allocated_bytes >= 4096);
  for (size_t i = 0; i < sizeof st.guard; ++i) CHECK(st.guard[i] == 0xAB);
  /* A binding through the unsized symbol: the size read from the struct. */
  memset(&st, 0xAB, sizeof st);
  st.s.struct_size = sizeof st.s;
  OK((ferry_get_pool_stats)(rt, (ferry_pool_stats*)&st.s));
  CHECK(st.s.struct_size == sizeof st.s && st.s.allocs == 1 && st.s.allocated_bytes >= 4096);
  for (size_t i = 0; i < sizeof st.guard; ++i) CHECK(st.guard[i] == 0xAB);

  /* A newer caller's struct, larger than this library's: its own fields are
   * written, struct_size says how many; an unknown field set is refused. */
  struct {
    ferry_pool_stats s;
    uint64_t later_field;
  } newer;
  memset(&newer, 0xCD, sizeof newer);
  OK(ferry_get_pool_stats_sized(rt, &newer.s, sizeof newer));
  CHECK(newer.s.struct_size == sizeof(ferry_pool_stats) && newer.s.allocs == 1);
  CHECK(newer.later_field == 0xCDCDCDCDCDCDCDCDull);
  struct {
    ferry_runtime_options o;
    uint64_t later_field;
  } newer_options;
  memset(&newer_options, 0, sizeof newer_options);
  ferry_runtime_options_init(&newer_options.o);
  newer_options.o.struct_size = sizeof newer_options;
  newer_options.o.profile = "tiny";
  ferry_runtime other = NULL;
  OK(ferry_runtime_create(&newer_options.o, &other)); /* the unknown field at its default (zero) */
  ferry_runtime_destroy(other);
  other = NULL;
  newer_options.later_field = 1;
  CHECK(ferry_runtime_create(&newer_options.o, &other) == FERRY_ERROR_UNSUPPORTED && other == NULL);
  CHECK(strstr(ferry_last_error(), "does not know") != NULL);
  ferry_runtime_destroy(rt);
}

/* The i-th (0..5) struct_size refused for a struct whose first release was v1
 * bytes: 0, too small, not a multiple of 8, absurd. */
static size_t bad_size(size_t v1, size_t i) {
  const size_t sizes[6] = {0, 8, v1 - 8, v1 + 4, 4104, (size_t)-1};
  return sizes[i];
}

/* A struct that was never initialised, or whose size is garbage, is refused with
 * INVALID_ARGUMENT and a message, the outputs untouched. */
static void test_struct_size_refused(void) {
  static const size_t bad[] = {0, 1, 8, FERRY_RUNTIME_OPTIONS_V1_SIZE - 8, FERRY_RUNTIME_OPTIONS_V1_SIZE + 4, 4104,
                               (size_t)-1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    ferry_runtime_options o;
    ferry_runtime_options_init(&o);
    o.struct_size = bad[i];
    ferry_runtime rt = NULL;
    CHECK(ferry_runtime_create(&o, &rt) == FERRY_ERROR_INVALID_ARGUMENT && rt == NULL);
    CHECK(strstr(ferry_last_error(), "struct_size") != NULL);
    CHECK(ferry_runtime_options_init_sized(&o, bad[i]) == FERRY_ERROR_INVALID_ARGUMENT);
    CHECK(o.struct_size == bad[i]);
  }
  CHECK(ferry_runtime_options_init_sized(NULL, sizeof(ferry_runtime_options)) == FERRY_ERROR_INVALID_ARGUMENT);

  /* The unsized symbols (a binding's) read out->struct_size. */
  ferry_runtime rt = make("tiny", NULL, NULL, 1);
  ferry_pool_stats ps;
  memset(&ps, 0xEE, sizeof ps);
  ps.struct_size = 0;
  CHECK((ferry_get_pool_stats)(rt, &ps) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(ferry_last_error(), "not initialised") != NULL);
  CHECK(ps.struct_size == 0 && ps.allocs == 0xEEEEEEEEEEEEEEEEull);
  ps.struct_size = 0xEEEEEEEEEEEEEEEEull; /* garbage, as an uninitialised struct holds */
  CHECK((ferry_get_pool_stats)(rt, &ps) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK(ps.allocs == 0xEEEEEEEEEEEEEEEEull);
  ferry_integrity_stats is = {0};
  CHECK((ferry_get_integrity_stats)(rt, &is) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_cache_stats cs = {.struct_size = sizeof cs - 8};
  CHECK((ferry_get_cache_stats)(rt, &cs) == FERRY_ERROR_INVALID_ARGUMENT);
  CHECK((ferry_get_pool_stats)(rt, NULL) == FERRY_ERROR_INVALID_ARGUMENT);

  /* The sized functions refuse the same sizes as an argument, *out untouched. */
  for (size_t i = 0; i < 6; ++i) {
    memset(&ps, 0xEE, sizeof ps);
    CHECK(ferry_get_pool_stats_sized(rt, &ps, bad_size(FERRY_POOL_STATS_V1_SIZE, i)) == FERRY_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(ferry_last_error(), "ferry_get_pool_stats: struct_size is ") != NULL);
    CHECK(ps.struct_size == 0xEEEEEEEEEEEEEEEEull && ps.allocs == 0xEEEEEEEEEEEEEEEEull);
    memset(&is, 0xEE, sizeof is);
    CHECK(ferry_get_integrity_stats_sized(rt, &is, bad_size(FERRY_INTEGRITY_STATS_V1_SIZE, i)) ==
          FERRY_ERROR_INVALID_ARGUMENT);
    CHECK(is.struct_size == 0xEEEEEEEEEEEEEEEEull && is.bytes_moved == 0xEEEEEEEEEEEEEEEEull);
    memset(&cs, 0xEE, sizeof cs);
    CHECK(ferry_get_cache_stats_sized(rt, &cs, bad_size(FERRY_CACHE_STATS_V1_SIZE, i)) ==
          FERRY_ERROR_INVALID_ARGUMENT);
    CHECK(cs.struct_size == 0xEEEEEEEEEEEEEEEEull && cs.hits == 0xEEEEEEEEEEEEEEEEull);
  }
  CHECK(ferry_get_pool_stats_sized(rt, NULL, sizeof ps) == FERRY_ERROR_INVALID_ARGUMENT);
  ferry_runtime_destroy(rt);
}

/* A stats struct never initialised (0xAB in every byte, struct_size included)
 * through the getters' macros, as the first release's guide wrote the call:
 * each passes sizeof, so the getter fills the struct and sets struct_size. */
static void test_uninitialised_stats(void) {
  ferry_runtime rt = make("tiny", NULL, NULL, 1);
  ferry_handle h;
  OK(ferry_alloc(rt, 4096, 0, &h));
  static const unsigned char payload[4096] = {7};
  OK(ferry_upload(rt, 0, h, 0, payload, sizeof payload));
  const void* pieces[1] = {payload};
  const uint64_t piece_bytes[1] = {sizeof payload};
  OK(ferry_cache_define(rt, 9, pieces, piece_bytes, 1));
  ferry_handle slot;
  OK(ferry_cache_acquire(rt, 9, 0, &slot, NULL, NULL));
  OK(ferry_cache_release(rt, 9));
  OK(ferry_synchronize(rt));

  ferry_pool_stats ps;
  memset(&ps, 0xAB, sizeof ps);
  OK(ferry_get_pool_stats(rt, &ps));
  CHECK(ps.struct_size == sizeof ps);
  CHECK(ps.allocs >= 1 && ps.allocated_bytes >= 4096 && ps.frees <= ps.allocs);
  CHECK(ps.internal_allocs != 0xABABABABABABABABull && ps.internal_frees <= ps.internal_allocs);
  ferry_integrity_stats is;
  memset(&is, 0xAB, sizeof is);
  OK(ferry_get_integrity_stats(rt, &is));
  CHECK(is.struct_size == sizeof is && is.bytes_moved >= 4096 && is.mismatches == 0);
  ferry_cache_stats cs;
  memset(&cs, 0xAB, sizeof cs);
  OK(ferry_get_cache_stats(rt, &cs));
  CHECK(cs.struct_size == sizeof cs && cs.misses == 1 && cs.hits == 0 && cs.uploads == 1 && cs.evictions == 0);

  /* The same struct through a pointer, as a caller's helper would pass it. */
  ferry_pool_stats* p = &ps;
  memset(p, 0xAB, sizeof *p);
  OK(ferry_get_pool_stats(rt, p));
  CHECK(p->struct_size == sizeof *p && p->allocs >= 1);
  ferry_runtime_destroy(rt);
}

/* ferry_struct_size knows every struct of the header, as this program lays it out. */
static void test_struct_sizes(void) {
  CHECK(ferry_struct_size("ferry_handle") == sizeof(ferry_handle));
  CHECK(ferry_struct_size("ferry_runtime_options") == sizeof(ferry_runtime_options));
  CHECK(ferry_struct_size("ferry_operand") == sizeof(ferry_operand));
  CHECK(ferry_struct_size("ferry_launch_context") == sizeof(ferry_launch_context));
  CHECK(ferry_struct_size("ferry_pool_stats") == sizeof(ferry_pool_stats));
  CHECK(ferry_struct_size("ferry_integrity_stats") == sizeof(ferry_integrity_stats));
  CHECK(ferry_struct_size("ferry_race_side") == sizeof(ferry_race_side));
  CHECK(ferry_struct_size("ferry_race") == sizeof(ferry_race));
  CHECK(ferry_struct_size("ferry_cache_stats") == sizeof(ferry_cache_stats));
  CHECK(ferry_struct_size("ferry_no_such_struct") == 0);
  CHECK(ferry_struct_size(NULL) == 0);
}

int main(int argc, char** argv) {
  test_basics();
  test_old_caller();
  test_struct_size_refused();
  test_uninitialised_stats();
  test_struct_sizes();
  test_memory_and_transfers();
  test_launch_hold_record_use();
  test_integrity();
  test_cache_and_trace(argc > 1 ? argv[1] : "c_abi_test.trace.jsonl");
  test_races();
  if (failures == 0) printf("c_abi_test: every check passed\n");
  return failures == 0 ? 0 : 1;
}

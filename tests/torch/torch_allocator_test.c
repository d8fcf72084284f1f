/* libferry_torch.so as PyTorch's CUDAPluggableAllocator loads it: dlopen, then
 * dlsym of the allocator's functions. Without a GPU every allocation is NULL
 * with a readable reason and nothing crashes; with one, a block round-trips.
 * C, so that ferry_torch.h is proven to compile as C. Exit 0 pass, 1 fail. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ferry/ferry_torch.h"

typedef void* (*malloc_fn)(ssize_t, int, void*);
typedef void (*free_fn)(void*, ssize_t, int, void*);
typedef const char* (*last_error_fn)(void);
typedef int (*stats_fn)(int, ferry_pool_stats*);
typedef int (*sized_stats_fn)(int, ferry_pool_stats*, size_t);

/* ferry_torch.h's macro compiles to the sized call (unevaluated here: no link). */
_Static_assert(sizeof(ferry_torch_get_stats(0, (ferry_pool_stats*)0)) == sizeof(int), "the macro's call is an int");

static int failures = 0;
#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      ++failures;                                     \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                   \
      fprintf(stderr, "\n");                          \
    }                                                 \
  } while (0)

/* One line of printable text, long enough to say something. */
static int is_sentence(const char* s) {
  size_t n = strlen(s);
  if (n < 12) return 0;
  for (size_t i = 0; i < n; ++i) {
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f) return 0;
  }
  return 1;
}

int main(void) {
  void* lib = dlopen(FERRY_TORCH_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "FAIL: dlopen(%s): %s\n", FERRY_TORCH_LIBRARY, dlerror());
    return 1;
  }
  malloc_fn tmalloc = (malloc_fn)dlsym(lib, "ferry_torch_malloc");
  free_fn tfree = (free_fn)dlsym(lib, "ferry_torch_free");
  last_error_fn last_error = (last_error_fn)dlsym(lib, "ferry_torch_last_error");
  stats_fn get_stats = (stats_fn)dlsym(lib, "ferry_torch_get_stats");
  sized_stats_fn get_stats_sized = (sized_stats_fn)dlsym(lib, "ferry_torch_get_stats_sized");
  if (!tmalloc || !tfree || !last_error || !get_stats || !get_stats_sized) {
    fprintf(stderr, "FAIL: a ferry_torch_* symbol is not exported\n");
    return 1;
  }
  /* Hidden visibility: ferry's C++ inside is not exported. */
  CHECK(dlsym(lib, "_ZN5ferry7Runtime6createENS_14RuntimeOptionsE") == NULL, "ferry::Runtime::create is exported");

  CHECK(strcmp(last_error(), "") == 0, "a fresh thread has no error, got '%s'", last_error());
  tfree(NULL, 0, 0, NULL); /* harmless */
  tfree(NULL, 1024, 3, (void*)0x1234);
  CHECK(strcmp(last_error(), "") == 0, "free(NULL) is no error, got '%s'", last_error());
  CHECK(tmalloc(0, 0, NULL) == NULL, "a 0-byte malloc is NULL");
  CHECK(tmalloc(-1, 0, NULL) == NULL, "a negative malloc is NULL");

  ferry_pool_stats stats = {.struct_size = sizeof stats}; /* dlsym's unsized symbol reads it */
  CHECK(get_stats(0, NULL) == FERRY_ERROR_INVALID_ARGUMENT, "NULL out");
  CHECK(get_stats(-1, &stats) == FERRY_ERROR_INVALID_ARGUMENT, "negative device");
  CHECK(get_stats_sized(0, NULL, sizeof stats) == FERRY_ERROR_INVALID_ARGUMENT, "NULL out");
  memset(&stats, 0xAB, sizeof stats);
  CHECK(get_stats(7, &stats) == FERRY_ERROR_INVALID_ARGUMENT && is_sentence(last_error()),
        "an unset struct_size through the unsized symbol: '%s'", last_error());
  CHECK(get_stats_sized(7, &stats, 4) == FERRY_ERROR_INVALID_ARGUMENT && stats.allocs == 0xABABABABABABABABull,
        "a struct_size of 4: '%s'", last_error());
  stats.struct_size = sizeof stats; /* for the unsized symbol below */
  CHECK(tmalloc(1024, -1, NULL) == NULL && is_sentence(last_error()), "negative device: '%s'", last_error());

  void* p = tmalloc(1 << 20, 0, NULL);
  if (p == NULL) {
    const char* why = last_error();
    printf("without a GPU: ferry_torch_malloc -> NULL: %s\n", why);
    CHECK(is_sentence(why), "the reason is a sentence: '%s'", why);
    CHECK(get_stats(0, &stats) != FERRY_OK, "the failed device's stats report its failure");
    /* Not retried, still polite. */
    CHECK(tmalloc(4096, 0, (void*)0x1) == NULL && is_sentence(last_error()), "again: '%s'", last_error());
    tfree((void*)0x1000, 4096, 0, NULL); /* never allocated: ignored */
    CHECK(is_sentence(last_error()), "a foreign free says so: '%s'", last_error());
    CHECK(get_stats(7, &stats) == FERRY_OK && stats.allocs == 0, "an untouched device has zero stats");
    /* As ferry_torch.h's macro calls it: the caller's sizeof, the struct never set. */
    memset(&stats, 0xAB, sizeof stats);
    CHECK(get_stats_sized(7, &stats, sizeof stats) == FERRY_OK && stats.struct_size == sizeof stats &&
              stats.allocs == 0 && stats.internal_frees == 0,
          "an uninitialised struct, sized: '%s'", last_error());
  } else {
    printf("with a GPU: ferry_torch_malloc(1 MiB) = %p\n", p);
    CHECK(get_stats(0, &stats) == FERRY_OK, "stats: %s", last_error());
    CHECK(stats.allocated_bytes >= (1 << 20) && stats.allocs == 1, "stats count the block");
    tfree(p, 1 << 20, 0, NULL);
    CHECK(strcmp(last_error(), "") == 0, "free: '%s'", last_error());
    CHECK(get_stats(0, &stats) == FERRY_OK && stats.frees == 1, "stats count the free");
    memset(&stats, 0xAB, sizeof stats);
    CHECK(get_stats_sized(0, &stats, sizeof stats) == FERRY_OK && stats.struct_size == sizeof stats &&
              stats.frees == 1,
          "an uninitialised struct, sized: '%s'", last_error());
    tfree(p, 1 << 20, 0, NULL); /* double free: ignored with a message */
    CHECK(is_sentence(last_error()), "a double free says so: '%s'", last_error());
  }
  /* No dlclose: the library keeps its runtimes until the process exits, as in PyTorch. */
  if (failures) return 1;
  printf("torch_allocator_test: ok\n");
  return 0;
}

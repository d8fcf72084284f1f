/* A C program built with pkg-config against the installed ferry.h and libferry.so. */
#include <stdio.h>
#include <string.h>

#include <ferry/ferry.h>

int main(void) {
  ferry_runtime_options options;
  ferry_runtime_options_init(&options);
  options.profile = "tiny";
  ferry_runtime rt = NULL;
  if (ferry_runtime_create(&options, &rt) != FERRY_OK) {
    fprintf(stderr, "ferry_runtime_create: %s\n", ferry_last_error());
    return 1;
  }
  ferry_handle h;
  char in[256] = "ferry from C", out[256] = {0};
  int ok = ferry_alloc(rt, sizeof in, 0, &h) == FERRY_OK && ferry_upload(rt, 0, h, 0, in, sizeof in) == FERRY_OK &&
           ferry_download(rt, 0, h, 0, out, sizeof out) == FERRY_OK && strcmp(in, out) == 0 &&
           ferry_free(rt, h) == FERRY_OK && ferry_free(rt, h) == FERRY_ERROR_STALE_HANDLE;
  ferry_runtime_destroy(rt);
  printf("c consumer (ferry %s): %s\n", ferry_version(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

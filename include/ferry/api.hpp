// ferry — what the shared library exports: every declaration of the public
// headers (each header's `namespace ferry FERRY_API` block), nothing of src/,
// which the hidden visibility preset keeps inside the library.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
// A type a public header must name but the library never exports (test hooks).
#define FERRY_HIDDEN __attribute__((visibility("hidden")))
#else
#define FERRY_API
#define FERRY_HIDDEN
#endif

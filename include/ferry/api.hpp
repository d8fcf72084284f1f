// ferry — what the shared library exports: every declaration of the public
// headers (each header's `namespace ferry FERRY_API` block), nothing of src/,
// which the hidden visibility preset keeps inside the library.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

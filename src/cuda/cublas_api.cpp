#include "cuda/cublas_api.hpp"

#include <dlfcn.h>

#include <type_traits>

#ifndef FERRY_CUDA_LIBRARY_DIR
#error "FERRY_CUDA_LIBRARY_DIR (the toolkit's library directory) comes from src/cuda/CMakeLists.txt"
#endif

namespace ferry::cuda_detail {
namespace {

#define FERRY_STRINGIFY_(x) #x
#define FERRY_STRINGIFY(x) FERRY_STRINGIFY_(x)
// The major version the headers describe: its ABI is the one the pointers assume.
constexpr const char* kSoname = "libcublas.so." FERRY_STRINGIFY(CUBLAS_VER_MAJOR);
constexpr const char* kToolkitPath =
    FERRY_CUDA_LIBRARY_DIR "/libcublas.so." FERRY_STRINGIFY(CUBLAS_VER_MAJOR);
#undef FERRY_STRINGIFY
#undef FERRY_STRINGIFY_

// Fails to compile when the exported cublasGemmEx no longer has this signature
// (unevaluated: no reference to the symbol reaches the linker).
static_assert(std::is_same_v<decltype(static_cast<CublasGemmExFn>(&cublasGemmEx)), CublasGemmExFn>);

struct Loaded {
  CublasApi api;
  bool ok = false;
  std::string why;  // when not ok
};

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

template <class Fn>
bool symbol(void* library, const char* name, Fn& out, std::string& why) {
  (void)dlerror();
  void* fn = dlsym(library, name);
  if (fn == nullptr) {
    why = std::string(kSoname) + " lacks " + name + " (" + dl_error() + ")";
    return false;
  }
  out = reinterpret_cast<Fn>(fn);
  return true;
}

Loaded load() {
  Loaded l;
  // The soname first (the loader's path, LD_LIBRARY_PATH, ldconfig); then the toolkit
  // ferry was built with. libcublas finds its libcublasLt through its own $ORIGIN.
  void* library = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const std::string first = dl_error();
    library = dlopen(kToolkitPath, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      l.why = std::string("cannot load cuBLAS: ") + kSoname + ": " + first + "; " + kToolkitPath +
              ": " + dl_error();
      return l;
    }
  }
  // Never closed: handles of any backend may still use it, and unloading a CUDA
  // library at exit races with the runtime's own teardown.
  CublasApi& a = l.api;
  (void)symbol(library, "cublasGetStatusName", a.get_status_name, l.why);
  (void)symbol(library, "cublasGetStatusString", a.get_status_string, l.why);
  if (symbol(library, "cublasCreate_v2", a.create, l.why) &&
      symbol(library, "cublasDestroy_v2", a.destroy, l.why) &&
      symbol(library, "cublasSetStream_v2", a.set_stream, l.why) &&
      symbol(library, "cublasSetMathMode", a.set_math_mode, l.why) &&
      symbol(library, "cublasGemmEx", a.gemm_ex, l.why)) {
    l.why.clear();
    l.ok = true;
  }
  return l;
}

}  // namespace

std::string CublasApi::describe(cublasStatus_t status) const {
  const std::string number = std::to_string(static_cast<int>(status));
  const char* name = get_status_name != nullptr ? get_status_name(status) : nullptr;
  std::string text = name != nullptr ? name + (" (" + number + ")") : "cuBLAS status " + number;
  if (get_status_string != nullptr) {
    if (const char* s = get_status_string(status); s != nullptr) text += ": " + std::string(s);
  }
  return text;
}

const CublasApi* cublas_api(std::string& why) {
  // Once; later callers wait for the first. Never freed: a backend destroyed during
  // static destruction still destroys its handles through it.
  static const Loaded* const loaded = new Loaded(load());
  if (!loaded->ok) {
    why = loaded->why;
    return nullptr;
  }
  return &loaded->api;
}

}  // namespace ferry::cuda_detail

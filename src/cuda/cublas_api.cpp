#include "cuda/cublas_api.hpp"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

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

// One place to look: the path handed to dlopen, and what to call it in messages.
struct Candidate {
  std::string path;
  std::string found_by;
};

// Where a PyTorch wheel keeps its CUDA libraries (site-packages/nvidia/cu13/lib; before
// CUDA 13, nvidia/cublas/lib), under the usual prefixes. None is on the loader's path:
// torch finds them relative to itself.
std::vector<std::string> wheel_dirs() {
  std::vector<std::string> prefixes;
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv != nullptr && *venv != 0) {
    prefixes.push_back(std::string(venv) + "/lib/python3*/site-packages");
  }
  if (const char* conda = std::getenv("CONDA_PREFIX"); conda != nullptr && *conda != 0) {
    prefixes.push_back(std::string(conda) + "/lib/python3*/site-packages");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != 0) {
    prefixes.push_back(std::string(home) + "/.local/lib/python3*/site-packages");
  }
  for (const char* p : {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                        "/usr/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages",
                        "/opt/conda/lib/python3*/site-packages"}) {
    prefixes.emplace_back(p);
  }
  std::vector<std::string> dirs;
  for (const std::string& prefix : prefixes) {
    for (const char* sub : {"/nvidia/cu" FERRY_STRINGIFY(CUBLAS_VER_MAJOR) "/lib", "/nvidia/cublas/lib"}) {
      glob_t g{};
      if (glob((prefix + sub).c_str(), 0, nullptr, &g) == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i) dirs.emplace_back(g.gl_pathv[i]);
      }
      globfree(&g);
    }
  }
  return dirs;
}

// The search order: an explicit FERRY_CUBLAS_PATH (a file or a directory) first, then
// the soname through the loader (LD_LIBRARY_PATH, ldconfig, or a cuBLAS already in the
// process, as under PyTorch), $CUDA_HOME/lib64, a PyTorch wheel's layout, and last the
// toolkit ferry was built with.
std::vector<Candidate> candidates() {
  std::vector<Candidate> c;
  if (const char* env = std::getenv("FERRY_CUBLAS_PATH"); env != nullptr && *env != 0) {
    std::error_code ec;
    const bool dir = std::filesystem::is_directory(env, ec);
    c.push_back({dir ? std::string(env) + "/" + kSoname : std::string(env), "FERRY_CUBLAS_PATH"});
  }
  c.push_back({kSoname, "the loader's search path"});
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* home = std::getenv(var); home != nullptr && *home != 0) {
      c.push_back({std::string(home) + "/lib64/" + kSoname, std::string("$") + var + "/lib64"});
    }
  }
  for (const std::string& dir : wheel_dirs()) c.push_back({dir + "/" + kSoname, "a PyTorch wheel's " + dir});
  c.push_back({kToolkitPath, "the CUDA toolkit of the build"});
  return c;
}

// The file the loader actually opened for `library`.
std::string loaded_path(void* library, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != 0) {
    return map->l_name;
  }
  return fallback;
}

Loaded load() {
  Loaded l;
  // libcublas finds its libcublasLt through its own $ORIGIN.
  void* library = nullptr;
  std::string tried;
  for (const Candidate& c : candidates()) {
    library = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      l.api.path = loaded_path(library, c.path);
      l.api.found_by = c.found_by;
      break;
    }
    tried += (tried.empty() ? "" : "; ") + c.path + " (" + c.found_by + "): " + dl_error();
  }
  if (library == nullptr) {
    l.why = std::string("cannot load cuBLAS (") + kSoname +
            "; set FERRY_CUBLAS_PATH to its file or folder): " + tried;
    return l;
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

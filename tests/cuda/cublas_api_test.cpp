// The cuBLAS loader without a GPU: cuBLAS is not linked into ferry, it is loaded by
// the first call and only then (a binary must start, fast, on machines without it).
// Run twice by ctest: as found, and with FERRY_CUBLAS_PATH naming the toolkit's folder.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuda/cublas_api.hpp"

namespace ferry {
namespace {

#define FERRY_TEST_STR_(x) #x
#define FERRY_TEST_STR(x) FERRY_TEST_STR_(x)
constexpr const char* kSoname = "libcublas.so." FERRY_TEST_STR(CUBLAS_VER_MAJOR);

bool cublas_in_process() {
  void* h = dlopen(kSoname, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

TEST(CudaCublasApi, LoadsOnTheFirstCallOnly) {
  ASSERT_FALSE(cublas_in_process()) << "cuBLAS was loaded before it was asked for (linked?)";
  std::string why;
  const cuda_detail::CublasApi* api = cuda_detail::cublas_api(why);
  if (api == nullptr) {
    EXPECT_NE(why.find(kSoname), std::string::npos) << why;  // the message names the library
    GTEST_SKIP() << why;
  }
  EXPECT_TRUE(cublas_in_process());
  // Where it came from, for ferry doctor: a real file and the search that found it.
  EXPECT_NE(api->path.find(kSoname), std::string::npos) << api->path;
  EXPECT_FALSE(api->found_by.empty());
  if (const char* env = std::getenv("FERRY_CUBLAS_PATH"); env != nullptr && *env != 0) {
    EXPECT_EQ(api->found_by, "FERRY_CUBLAS_PATH") << api->path;
    EXPECT_EQ(api->path.rfind(env, 0), 0u) << api->path << " is not under " << env;
  }
  EXPECT_NE(api->create, nullptr);
  EXPECT_NE(api->destroy, nullptr);
  EXPECT_NE(api->set_stream, nullptr);
  EXPECT_NE(api->set_math_mode, nullptr);
  EXPECT_NE(api->gemm_ex, nullptr);
  const std::string text = api->describe(CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(text.find(std::to_string(static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED))), std::string::npos)
      << text;
  std::string again;
  EXPECT_EQ(cuda_detail::cublas_api(again), api);  // loaded once
}

}  // namespace
}  // namespace ferry

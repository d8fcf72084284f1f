// Helpers for the weight-bank tests: a temporary directory, and raw safetensors
// bytes built by hand (so a test can make any malformed file it needs).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ferry::testing {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("ferry_weights_") + (info ? info->name() : "x") + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

  std::string write(const std::string& name, const std::vector<std::byte>& bytes) const {
    const std::string p = file(name);
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

 private:
  std::filesystem::path path_;
};

// 8-byte little-endian length + header text + data. `length` overrides the
// header length field (to lie about it).
inline std::vector<std::byte> raw_safetensors(const std::string& header, std::size_t data_bytes,
                                              std::optional<std::uint64_t> length = std::nullopt) {
  const std::uint64_t n = length.value_or(header.size());
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i * 7 + 1));
  return out;
}

}  // namespace ferry::testing

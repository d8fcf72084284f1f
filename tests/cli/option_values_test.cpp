#include "option_values.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ferry::cli {
namespace {

TEST(ByteSize, AcceptsPlainBytesAndBinarySuffixes) {
  struct Case {
    const char* text;
    std::uint64_t bytes;
  };
  const Case cases[] = {
      {"1", 1},
      {"4096", 4096},
      {"64B", 64},
      {"1KiB", 1024},
      {"64MiB", 64ull << 20},
      {"64 MiB", 64ull << 20},
      {"2GiB", 2ull << 30},
      {"3TiB", 3ull << 40},
      {"18446744073709551615", ~0ull},
      {"16777215TiB", 16777215ull << 40},
      // Item 20: decimal units, fractions and any case.
      {"64MB", 64'000'000},
      {"64mb", 64'000'000},
      {"64mib", 64ull << 20},
      {"1.5GiB", 3ull << 29},
      {"1.5 gib", 3ull << 29},
      {"2.5KB", 2500},
      {"1kib", 1024},
      {"3TB", 3'000'000'000'000},
      {"0.5KiB", 512},
  };
  for (const Case& c : cases) {
    Result<std::uint64_t> r = parse_byte_size(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.error().message;
    EXPECT_EQ(*r, c.bytes) << c.text;
  }
}

TEST(ByteSize, RejectsWhatIsNotAByteCount) {
  const char* bad[] = {"",      "MiB",   "-1",   "+1",   "0",     "0MiB", "1.5B", "12XB",
                       "1.",    ".5GiB", "64 M", "1e9",  "0x10",  " 64",  "64MiBs", "0.0001KiB",
                       "18446744073709551616", "16777216TiB", "99999999999999999999GiB", "18446744073.709551616GB"};
  for (const char* text : bad) {
    Result<std::uint64_t> r = parse_byte_size(text);
    EXPECT_FALSE(r.ok()) << '"' << text << "\" parsed as " << r.value_or(0);
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
      EXPECT_FALSE(r.error().message.empty());
    }
  }
}

TEST(UnsignedOption, DecimalAndHexWithoutWrapping) {
  EXPECT_EQ(parse_u64("0").value_or(9), 0u);
  EXPECT_EQ(parse_u64("42").value_or(0), 42u);
  EXPECT_EQ(parse_u64("0x2a").value_or(0), 42u);
  EXPECT_EQ(parse_u64("18446744073709551615").value_or(0), ~0ull);
  for (const char* bad : {"", "-1", "18446744073709551616", "0x", "12a", "1 ", "0x1g"}) {
    EXPECT_FALSE(parse_u64(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace ferry::cli

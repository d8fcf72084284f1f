// WeightBank: valid files load and hash right, a malformed corpus gives clear
// errors naming the file and the offset or tensor, random damage never crashes,
// synthetic banks are deterministic, placement makes uploads land right.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/forwarding_backend.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/sim_backend.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/weight_bank.hpp"
#include "weights_test_util.hpp"

namespace ferry {
namespace {

using testing::raw_safetensors;
using testing::TempDir;
using testing::pattern;

TEST(DType, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::i8), 1u);
  EXPECT_EQ(to_string(DType::f8_e4m3), "F8_E4M3");
  for (const char* n : {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "I16", "U16", "F16", "BF16", "I32", "U32",
                        "F32", "I64", "U64", "F64"}) {
    auto d = parse_dtype(n);
    ASSERT_TRUE(d.ok()) << n;
    EXPECT_EQ(to_string(*d), n);
  }
  auto bad = parse_dtype("Q4_K");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bad.error().message.find("Q4_K"), std::string::npos);
}

TEST(WeightBank, WrittenFileLoadsAndHashesRight) {
  TempDir dir;
  const auto a = pattern(1, 4 * 8 * 2), b = pattern(2, 16), c = pattern(3, 2 * 3 * 4);
  const std::vector<TensorToWrite> tensors = {
      {"layer.a", DType::bf16, {4, 8}, a}, {"layer.b", DType::i8, {16}, b}, {"c", DType::f32, {2, 3}, c}};
  const std::string path = dir.file("ok.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}}).ok());

  auto bank = WeightBank::open_safetensors(path);
  ASSERT_TRUE(bank.ok()) << bank.error().message;
  EXPECT_TRUE(bank->from_file());
  EXPECT_EQ(bank->source(), path);
  ASSERT_EQ(bank->tensors().size(), 3u);
  EXPECT_EQ(bank->metadata().at("format"), "pt");
  EXPECT_EQ(bank->data_bytes(), a.size() + b.size() + c.size());
  for (const TensorToWrite& t : tensors) {
    auto i = bank->require(t.name, t.dtype, t.shape);
    ASSERT_TRUE(i.ok()) << i.error().message;
    const auto bytes = bank->bytes(*i);
    ASSERT_EQ(bytes.size(), t.data.size());
    EXPECT_EQ(std::memcmp(bytes.data(), t.data.data(), bytes.size()), 0) << t.name;
    EXPECT_EQ(bank->hash(*i), content_hash(t.data)) << t.name;
    EXPECT_EQ(bank->hash(*i), content_hash(t.data)) << "cached hash";
  }
  // Tensors come in file order.
  EXPECT_EQ(bank->tensors()[0].name, "layer.a");
  EXPECT_EQ(bank->tensors()[2].name, "c");
}

TEST(WeightBank, RequireNamesWhatDiffers) {
  TempDir dir;
  const auto a = pattern(1, 32);
  const std::vector<TensorToWrite> t = {{"w", DType::bf16, {4, 4}, a}};
  const std::string path = dir.file("r.safetensors");
  ASSERT_TRUE(write_safetensors(path, t).ok());
  auto bank = WeightBank::open_safetensors(path);
  ASSERT_TRUE(bank.ok());
  const std::vector<std::uint64_t> s44{4, 4}, s28{2, 8};
  auto missing = bank->require("nope", DType::bf16, s44);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("\"nope\" is missing"), std::string::npos) << missing.error().message;
  EXPECT_NE(missing.error().message.find(path), std::string::npos);
  auto dtype = bank->require("w", DType::f16, s44);
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.error().message.find("BF16 [4, 4], expected F16 [4, 4]"), std::string::npos)
      << dtype.error().message;
  auto shape = bank->require("w", DType::bf16, s28);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.error().message.find("expected BF16 [2, 8]"), std::string::npos);
}

// --- the malformed corpus ------------------------------------------------------

struct Malformed {
  const char* name;
  std::vector<std::byte> bytes;
  const char* expect;  // a phrase the message must contain
};

std::vector<Malformed> corpus() {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  std::vector<Malformed> c;
  c.push_back({"empty", {}, "truncated: the file is 0 bytes"});
  c.push_back({"five_bytes", std::vector<std::byte>(5), "truncated: the file is 5 bytes"});
  c.push_back({"length_past_eof", raw_safetensors(good, 16, 4096), "header length 4096"});
  c.push_back({"length_2^64-1", raw_safetensors(good, 16, UINT64_MAX), "beyond 2^64"});
  c.push_back({"length_zero", raw_safetensors(good, 16, 0), "the JSON header is missing"});
  c.push_back({"truncated_data", raw_safetensors(good, 10), "past the end of the file"});
  c.push_back({"offsets_out_of_range",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[100,116]}})", 16),
               "past the end of the file"});
  c.push_back({"offsets_reversed",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", 16), "reversed"});
  c.push_back({"size_mismatch",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", 16),
               "needs 24"});
  c.push_back({"overlapping",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                               16),
               "overlap"});
  c.push_back({"unknown_dtype",
               raw_safetensors(R"({"a":{"dtype":"Q4_K","shape":[16],"data_offsets":[0,16]}})", 16),
               "unknown dtype \"Q4_K\""});
  c.push_back({"bad_json", raw_safetensors(R"({"a":{"dtype":"F32",)", 16), "malformed near offset"});
  c.push_back({"not_object", raw_safetensors("[1,2,3]", 16), "not a JSON object"});
  c.push_back({"deep_nesting", raw_safetensors(std::string(100000, '[') + std::string(100000, ']'), 0),
               "nests deeper than 64"});
  c.push_back({"negative_shape",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}})", 16),
               "not a non-negative integer"});
  c.push_back({"shape_overflow",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16),
               "overflows"});
  c.push_back({"missing_dtype", raw_safetensors(R"({"a":{"shape":[4],"data_offsets":[0,16]}})", 16),
               "\"dtype\" is missing"});
  c.push_back({"offsets_not_pair",
               raw_safetensors(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", 16), "data_offsets"});
  c.push_back({"metadata_not_strings",
               raw_safetensors(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16),
               "__metadata__"});
  c.push_back({"entry_not_object", raw_safetensors(R"({"a":7})", 16), "not a JSON object"});
  return c;
}

TEST(WeightBank, MalformedCorpusGivesClearErrors) {
  TempDir dir;
  for (const Malformed& m : corpus()) {
    SCOPED_TRACE(m.name);
    const std::string path = dir.write(std::string(m.name) + ".safetensors", m.bytes);
    auto bank = WeightBank::open_safetensors(path);
    ASSERT_FALSE(bank.ok());
    EXPECT_EQ(bank.error().code, ErrorCode::invalid_argument);
    const std::string& msg = bank.error().message;
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message must start with the file: " << msg;
    EXPECT_NE(msg.find(m.expect), std::string::npos) << msg;
  }
}

TEST(WeightBank, ErrorsNameTheOffset) {
  TempDir dir;
  // Data section starts at 8 + header length; END 116 lands at file offset 8 + n + 116.
  const std::string h = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[100,116]}})";
  const std::string path = dir.write("off.safetensors", raw_safetensors(h, 16));
  auto bank = WeightBank::open_safetensors(path);
  ASSERT_FALSE(bank.ok());
  EXPECT_NE(bank.error().message.find("file offset " + std::to_string(8 + h.size() + 116)), std::string::npos)
      << bank.error().message;
}

TEST(WeightBank, UnreadablePathIsAClearError) {
  auto bank = WeightBank::open_safetensors("/nonexistent/dir/w.safetensors");
  ASSERT_FALSE(bank.ok());
  EXPECT_EQ(bank.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(bank.error().message.find("cannot open"), std::string::npos);
  TempDir dir;
  auto d = WeightBank::open_safetensors(dir.file(""));  // a directory
  ASSERT_FALSE(d.ok());
}

// Item 10: what is not a regular file is refused at once, saying what it is. A
// FIFO with no writer used to hang in open(); a directory's message was a stale
// errno ("Inappropriate ioctl for device").
TEST(WeightBank, SpecialFilesAreRefusedAtOnceSayingWhatTheyAre) {
  TempDir dir;
  const std::string fifo = dir.file("w.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = WeightBank::open_safetensors(fifo);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().message, fifo + ": is a FIFO (a named pipe), not a regular file");
  auto d = WeightBank::open_safetensors(dir.file(""));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("is a directory"), std::string::npos) << d.error().message;
  EXPECT_EQ(d.error().message.find("ioctl"), std::string::npos) << d.error().message;
  auto z = WeightBank::open_safetensors("/dev/zero");
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.error().message.find("is a character device"), std::string::npos) << z.error().message;
}

// Item 9: the JSON parser ends at a NUL; garbage after one must not pass unread.
TEST(WeightBank, ANulByteInTheHeaderIsMalformed) {
  const std::string valid = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  std::string header = valid + std::string(1, '\0') + "garbage";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  auto r = WeightBank::parse_safetensors(raw_safetensors(header, 4), "nul.safetensors");
  ASSERT_FALSE(r.ok()) << "parsed " << r->size() << " tensors";
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("NUL byte at offset " + std::to_string(8 + valid.size())), std::string::npos)
      << r.error().message;
}

// Item 11: the bank holds the file's bytes, so a file truncated under a run
// (which killed a mapped run with SIGBUS) changes nothing the run reads.
TEST(WeightBank, AFileTruncatedAfterOpenIsStillReadWhole) {
  TempDir dir;
  const auto a = pattern(5, 3 * 4096);
  const std::string path = dir.file("shrinks.safetensors");
  const std::vector<TensorToWrite> tensors = {{"a", DType::u8, {3 * 4096}, a}};
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
  auto bank = WeightBank::open_safetensors(path);
  ASSERT_TRUE(bank.ok()) << bank.error().message;
  std::filesystem::resize_file(path, 0);
  const std::span<const std::byte> got = bank->bytes(0);
  ASSERT_EQ(got.size(), a.size());
  EXPECT_EQ(std::memcmp(got.data(), a.data(), a.size()), 0);
  EXPECT_EQ(bank->hash(0), content_hash(a));
}

// I7: random damage to a valid file is an error or a valid parse, never a crash.
TEST(WeightBank, RandomDamageNeverCrashes) {
  std::vector<TensorToWrite> tensors;
  const auto a = pattern(1, 64), b = pattern(2, 48);
  tensors.push_back({"alpha", DType::bf16, {4, 8}, a});
  tensors.push_back({"beta", DType::u8, {48}, b});
  TempDir dir;
  const std::string path = dir.file("base.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> base(chars.size());
  std::memcpy(base.data(), chars.data(), chars.size());
  std::uint64_t state = 42;
  int ok = 0, bad = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::byte> f = base;
    const int edits = 1 + static_cast<int>(splitmix64(state++) % 4);
    for (int e = 0; e < edits; ++e) {
      const std::uint64_t r = splitmix64(state++);
      switch (r % 4) {
        case 0: f[r / 4 % f.size()] = static_cast<std::byte>(r >> 40); break;  // flip a byte
        case 1: f.resize(r / 4 % (f.size() + 1)); break;                        // truncate
        case 2: f[r / 4 % 8 % f.size()] = static_cast<std::byte>(r >> 32); break;  // the length
        case 3: f.insert(f.begin() + static_cast<std::ptrdiff_t>(r / 4 % (f.size() + 1)),
                         static_cast<std::byte>(r >> 48));
                break;
      }
      if (f.empty()) break;
    }
    auto parsed = WeightBank::parse_safetensors(f, "fuzz");
    if (parsed.ok()) {
      ++ok;
      for (const TensorInfo& t : *parsed) EXPECT_LE(t.offset + t.bytes, f.size());
    } else {
      ++bad;
      EXPECT_EQ(parsed.error().code, ErrorCode::invalid_argument);
      EXPECT_EQ(parsed.error().message.rfind("fuzz: ", 0), 0u);
    }
  }
  EXPECT_GT(bad, 0);
}

TEST(WeightBank, WriterRefusesInconsistentTensors) {
  TempDir dir;
  const auto a = pattern(1, 10);
  std::vector<TensorToWrite> wrong_size = {{"a", DType::bf16, {4}, a}};
  EXPECT_FALSE(write_safetensors(dir.file("x"), wrong_size).ok());
  std::vector<TensorToWrite> dup = {{"a", DType::u8, {10}, a}, {"a", DType::u8, {10}, a}};
  EXPECT_FALSE(write_safetensors(dir.file("y"), dup).ok());
  std::vector<TensorToWrite> meta = {{"__metadata__", DType::u8, {10}, a}};
  EXPECT_FALSE(write_safetensors(dir.file("z"), meta).ok());
  std::vector<TensorToWrite> fine = {{"a", DType::u8, {10}, a}};
  EXPECT_FALSE(write_safetensors("/nonexistent/dir/f", fine).ok());
}

// --- synthetic banks ------------------------------------------------------------

std::vector<SyntheticTensor> synthetic_spec() {
  return {{"w0", DType::bf16, {16, 8}, 11}, {"w1", DType::i8, {33}, 12}, {"w2", DType::f32, {5, 7}, 13}};
}

TEST(WeightBank, SyntheticIsDeterministicAndAligned) {
  auto a = WeightBank::synthetic(synthetic_spec());
  auto b = WeightBank::synthetic(synthetic_spec());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->from_file());
  for (std::size_t i = 0; i < a->tensors().size(); ++i) {
    const auto x = a->bytes(i), y = b->bytes(i);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(x.data()) % 256, 0u);
    const auto expected = pattern(synthetic_spec()[i].seed, x.size());
    EXPECT_EQ(std::memcmp(x.data(), expected.data(), x.size()), 0);
    EXPECT_EQ(a->hash(i), content_hash(expected));
  }
  auto dup = std::vector<SyntheticTensor>{{"w", DType::u8, {1}, 1}, {"w", DType::u8, {1}, 2}};
  EXPECT_FALSE(WeightBank::synthetic(dup).ok());
  auto huge = std::vector<SyntheticTensor>{{"w", DType::f64, {UINT64_MAX / 2, 4}, 1}};
  EXPECT_FALSE(WeightBank::synthetic(huge).ok());
}

TEST(WeightBank, SyntheticRoundTripsThroughAFile) {
  TempDir dir;
  auto a = WeightBank::synthetic(synthetic_spec());
  ASSERT_TRUE(a.ok());
  const std::string path = dir.file("syn.safetensors");
  ASSERT_TRUE(write_safetensors(path, *a).ok());
  auto b = WeightBank::open_safetensors(path);
  ASSERT_TRUE(b.ok()) << b.error().message;
  for (const SyntheticTensor& t : synthetic_spec()) {
    auto i = a->require(t.name, t.dtype, t.shape);
    auto j = b->require(t.name, t.dtype, t.shape);
    ASSERT_TRUE(i.ok() && j.ok());
    EXPECT_EQ(a->hash(*i), b->hash(*j));
  }
}

// --- placement --------------------------------------------------------------------

class Placement : public ::testing::TestWithParam<BankPlacement> {};

TEST_P(Placement, UploadsOutOfThePlacedBankLandRight) {
  for (bool noop : {false, true}) {
    SCOPED_TRACE(noop ? "pinned-noop" : "healthy");
    SimFaults faults;
    if (noop) faults.pinned_noop = 1;
    auto sim = make_sim_backend({*find_profile("tiny"), 7, faults});
    StreamOrder order(*sim);
    DevicePool pool(order);
    HostArena arena(order);
    TransferEngine engine(pool, arena, {});
    ASSERT_TRUE(engine.status().ok());
    auto bank = WeightBank::synthetic(synthetic_spec());
    ASSERT_TRUE(bank.ok());
    ASSERT_TRUE(bank->place(engine, GetParam()).ok());
    EXPECT_TRUE(bank->placed());
    EXPECT_EQ(bank->placement(), GetParam());
    EXPECT_FALSE(bank->place(engine, GetParam()).ok()) << "placing twice is refused";
    if (GetParam() == BankPlacement::arena) {
      auto info = arena.locate(bank->bytes(0).data(), bank->bytes(0).size());
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->kind, HostRangeInfo::Kind::block);
    } else {
      EXPECT_EQ(arena.stats().regions, 1u);
    }
    for (int round = 0; round < 3; ++round) {
      for (std::size_t i = 0; i < bank->tensors().size(); ++i) {
        const auto src = bank->bytes(i);
        auto h = pool.allocate(src.size(), 1);
        ASSERT_TRUE(h.ok());
        TransferPlan plan;
        plan.add(src.data(), *h, 0, src.size());
        auto r = engine.upload(1, plan);
        ASSERT_TRUE(r.ok()) << r.error().message;
        ASSERT_TRUE(sim->synchronize().ok());
        std::vector<std::byte> got(src.size());
        ASSERT_TRUE(sim->peek(pool.resolve(*h)->addr, got).ok());
        EXPECT_EQ(content_hash(got), bank->hash(i));
        ASSERT_TRUE(pool.free(*h).ok());
      }
      sim->advance(1'000'000);  // let pinned mappings go stale (report 000)
    }
    ASSERT_TRUE(bank->unplace().ok());
    EXPECT_FALSE(bank->placed());
    EXPECT_EQ(arena.stats().regions, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Both, Placement, ::testing::Values(BankPlacement::registered, BankPlacement::arena),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// A bank registered with a second device's engine too (place_also): uploads
// there read pinned memory and land right; unplace() unregisters both; what it
// cannot serve is refused.
TEST(Placement, ASecondEngineUploadsFromTheSameRegisteredBytes) {
  std::vector<std::unique_ptr<SimBackend>> sims;
  std::vector<std::unique_ptr<StreamOrder>> orders;
  std::vector<std::unique_ptr<DevicePool>> pools;
  std::vector<std::unique_ptr<HostArena>> arenas;
  std::vector<std::unique_ptr<TransferEngine>> engines;
  for (std::uint64_t seed : {7u, 8u}) {
    sims.push_back(make_sim_backend({*find_profile("tiny"), seed, {}}));
    orders.push_back(std::make_unique<StreamOrder>(*sims.back()));
    pools.push_back(std::make_unique<DevicePool>(*orders.back()));
    arenas.push_back(std::make_unique<HostArena>(*orders.back()));
    engines.push_back(std::make_unique<TransferEngine>(*pools.back(), *arenas.back(), EngineOptions{}));
    ASSERT_TRUE(engines.back()->status().ok());
  }
  auto bank = WeightBank::synthetic(synthetic_spec());
  ASSERT_TRUE(bank.ok());
  EXPECT_EQ(bank->place_also(*engines[1]).error().code, ErrorCode::invalid_argument) << "not placed yet";
  ASSERT_TRUE(bank->place(*engines[0], BankPlacement::registered).ok());
  ASSERT_TRUE(bank->place_also(*engines[1]).ok());
  EXPECT_EQ(bank->place_also(*engines[1]).error().code, ErrorCode::invalid_argument) << "twice";
  EXPECT_EQ(bank->place_also(*engines[0]).error().code, ErrorCode::invalid_argument) << "the first engine";
  EXPECT_EQ(arenas[1]->stats().regions, 1u);
  for (std::size_t i = 0; i < bank->tensors().size(); ++i) {
    const auto src = bank->bytes(i);
    auto h = pools[1]->allocate(src.size(), 1);
    ASSERT_TRUE(h.ok());
    auto r = engines[1]->upload(1, TransferPlan().add(src.data(), *h, 0, src.size()));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(r->verified);
    ASSERT_TRUE(sims[1]->synchronize().ok());
    std::vector<std::byte> got(src.size());
    ASSERT_TRUE(sims[1]->peek(pools[1]->resolve(*h)->addr, got).ok());
    EXPECT_EQ(content_hash(got), bank->hash(i));
    ASSERT_TRUE(pools[1]->free(*h).ok());
  }
  EXPECT_EQ(engines[1]->counters().pageable, 0u) << "the second device read the bank as pinned memory";
  ASSERT_TRUE(bank->unplace().ok());
  EXPECT_EQ(arenas[0]->stats().regions, 0u);
  EXPECT_EQ(arenas[1]->stats().regions, 0u);

  auto lazy = WeightBank::synthetic(synthetic_spec(), "lazy", SyntheticStorage::lazy);
  ASSERT_TRUE(lazy.ok());
  ASSERT_TRUE(lazy->place(*engines[0], BankPlacement::registered).ok());
  EXPECT_EQ(lazy->place_also(*engines[1]).error().code, ErrorCode::invalid_argument)
      << "a lazy bank's stagings are ordered on one device";
  ASSERT_TRUE(lazy->unplace().ok());
}

// --- lazy synthetic banks ------------------------------------------------------------

TEST(LazyBank, HoldsTheBytesAResidentBankHolds) {
  auto lazy = WeightBank::synthetic(synthetic_spec(), "lazy", SyntheticStorage::lazy);
  auto resident = WeightBank::synthetic(synthetic_spec());
  ASSERT_TRUE(lazy.ok() && resident.ok());
  EXPECT_TRUE(lazy->lazy());
  EXPECT_FALSE(resident->lazy());
  EXPECT_EQ(lazy->stats().resident_bytes, 0u) << "a lazy bank holds nothing until a range is staged";
  EXPECT_GE(resident->stats().resident_bytes, resident->data_bytes());
  for (std::size_t i = 0; i < lazy->tensors().size(); ++i) {
    const TensorInfo& t = lazy->tensors()[i];
    EXPECT_EQ(t.offset, resident->tensors()[i].offset);
    EXPECT_TRUE(lazy->bytes(i).empty());
    std::vector<std::byte> got(t.bytes);
    lazy->read(i, 0, got);
    EXPECT_EQ(std::memcmp(got.data(), resident->bytes(i).data(), t.bytes), 0);
    EXPECT_EQ(lazy->hash(i), resident->hash(i));
    EXPECT_EQ(lazy->hash(i, 3, t.bytes - 5), resident->hash(i, 3, t.bytes - 5));
  }
  // Past one generation piece, hashed in pieces: the same value.
  const std::vector<SyntheticTensor> big = {{"big", DType::bf16, {3, 1u << 19}, 5, Pattern::small_bf16}};
  auto lb = WeightBank::synthetic(big, "lazy", SyntheticStorage::lazy);
  auto rb = WeightBank::synthetic(big);
  ASSERT_TRUE(lb.ok() && rb.ok());
  EXPECT_EQ(lb->hash(0), content_hash(rb->bytes(0)));
  EXPECT_EQ(lb->hash(0, 1000, 2'000'001), content_hash(rb->bytes(0).subspan(1000, 2'000'001)));

  TempDir dir;
  const std::string path = dir.file("lazy.safetensors");
  ASSERT_TRUE(write_safetensors(path, *lazy).ok());
  auto file = WeightBank::open_safetensors(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  for (std::size_t i = 0; i < lazy->tensors().size(); ++i) EXPECT_EQ(file->hash(i), lazy->hash(i));
}

TEST(LazyBank, StageNeedsAPlacementAndARangeInsideTheTensor) {
  auto bank = WeightBank::synthetic(synthetic_spec(), "lazy", SyntheticStorage::lazy);
  ASSERT_TRUE(bank.ok());
  EXPECT_EQ(bank->stage(0, 0, 16).error().code, ErrorCode::invalid_argument);
  auto sim = make_sim_backend({*find_profile("tiny"), 7, {}});
  StreamOrder order(*sim);
  DevicePool pool(order);
  HostArena arena(order);
  TransferEngine engine(pool, arena, {});
  ASSERT_TRUE(bank->place(engine, BankPlacement::registered).ok());
  const std::uint64_t n = bank->tensors()[0].bytes;
  EXPECT_EQ(bank->stage(0, 0, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(bank->stage(0, 1, n).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(bank->stage(bank->tensors().size(), 0, 16).error().code, ErrorCode::invalid_argument)
      << "no such tensor: an error, not a read past the table";
  auto whole = bank->stage(0, 0, n);
  ASSERT_TRUE(whole.ok());
  EXPECT_NE(whole->id, 0u);
  auto again = bank->stage(0, 0, n);  // the same range, still held: shared, not generated twice
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->bytes.data(), whole->bytes.data());
  EXPECT_EQ(bank->stats().staged, 1u);
  bank->release(*whole);
  bank->release(*again);
  EXPECT_EQ(bank->stats().dropped, 1u);
  ASSERT_TRUE(bank->unplace().ok());
}

// A device whose streams stop completing while `stuck`: every wait times out.
class Stalls final : public ForwardingBackend {
 public:
  explicit Stalls(Backend& inner) : ForwardingBackend(inner), inner_(inner) {}
  void stall(bool on) {
    for (StreamId s = 0; s < kMaxStreams; ++s) frozen_[s] = inner_.completed(s);
    stuck_ = on;
  }
  Ticket completed(StreamId stream) override {
    const Ticket t = inner_.completed(stream);
    return stuck_ ? std::min(t, frozen_[stream]) : t;
  }
  Result<void> wait(StreamPoint point, std::chrono::nanoseconds timeout) override {
    if (stuck_ && point.ticket > frozen_[point.stream]) return make_error(ErrorCode::timeout, "stalled");
    return inner_.wait(point, timeout);
  }

 private:
  Backend& inner_;
  bool stuck_ = false;
  std::array<Ticket, kMaxStreams> frozen_{};
};

// An unplace whose wait for the bank's transfers times out fails and leaves the
// bank placed with its bytes in place: the upload still in flight reads them.
// (Dropping them there would hand the copy zeros, and the destructor would unmap
// memory the device still reads.)
TEST(LazyBank, AnUnplaceThatTimesOutKeepsTheBankAndItsBytes) {
  auto bank = WeightBank::synthetic(synthetic_spec(), "lazy", SyntheticStorage::lazy);
  ASSERT_TRUE(bank.ok());
  auto sim = make_sim_backend({*find_profile("tiny"), 7, {}});
  Stalls device(*sim);
  StreamOrder order(device);
  DevicePool pool(order);
  HostArena arena(order);
  EngineOptions eo;
  eo.policy = IntegrityPolicy::off;
  TransferEngine engine(pool, arena, eo);
  ASSERT_TRUE(bank->place(engine, BankPlacement::registered).ok());
  const std::uint64_t n = bank->tensors()[0].bytes;
  auto range = bank->stage(0, 0, n);
  ASSERT_TRUE(range.ok());
  auto dst = pool.allocate(n, 1);
  ASSERT_TRUE(dst.ok());
  TransferPlan plan;
  plan.add(range->bytes.data(), *dst, 0, n);
  device.stall(true);
  auto pending = engine.begin_upload(1, plan);
  ASSERT_TRUE(pending.ok()) << pending.error().message;

  auto unplaced = bank->unplace();
  ASSERT_FALSE(unplaced.ok()) << "the copy in flight still reads the bank";
  EXPECT_EQ(unplaced.error().code, ErrorCode::timeout);
  EXPECT_TRUE(bank->placed());
  EXPECT_EQ(content_hash(range->bytes), bank->hash(0)) << "the staged bytes are still there";

  device.stall(false);
  auto receipt = engine.finish(std::move(*pending));
  ASSERT_TRUE(receipt.ok()) << receipt.error().message;
  bank->release(*range, receipt->done);
  ASSERT_TRUE(order.wait(receipt->done).ok());
  std::vector<std::byte> got(n);
  ASSERT_TRUE(sim->peek(pool.resolve(*dst)->addr, got).ok());
  EXPECT_EQ(content_hash(got), bank->hash(0)) << "the copy read the tensor, not zeros";
  ASSERT_TRUE(bank->unplace().ok());
  EXPECT_FALSE(bank->placed());
}

// With registered pieces of any size (here not a multiple of the page), the
// bytes canaries read at the start of each piece stay generated after every
// staging was dropped, including a canary that straddles two pages.
TEST(LazyBank, CanaryBytesStayForAnyPieceSize) {
  const std::vector<SyntheticTensor> spec = {{"big", DType::bf16, {5, 4096}, 9}};
  auto bank = WeightBank::synthetic(spec, "lazy", SyntheticStorage::lazy);
  auto resident = WeightBank::synthetic(spec);
  ASSERT_TRUE(bank.ok() && resident.ok());
  auto sim = make_sim_backend({*find_profile("tiny"), 7, {}});
  StreamOrder order(*sim);
  DevicePool pool(order);
  ArenaOptions ao;
  ao.register_piece_bytes = 4096 + 4000;  // piece 1 starts 96 bytes before a page ends
  HostArena arena(order, ao);
  TransferEngine engine(pool, arena, {});
  ASSERT_TRUE(bank->place(engine, BankPlacement::registered).ok());
  const std::uint64_t n = bank->tensors()[0].bytes;
  auto range = bank->stage(0, 0, n);
  ASSERT_TRUE(range.ok());
  const std::byte* base = range->bytes.data() - bank->tensors()[0].offset;
  bank->release(*range);  // no transfer read it: dropped at once
  EXPECT_EQ(bank->stats().dropped, 1u);
  const std::byte* want = resident->bytes(0).data() - resident->tensors()[0].offset;
  const std::uint64_t end = bank->tensors()[0].offset + n;
  for (std::uint64_t at = 0; at < end; at += ao.register_piece_bytes) {
    const std::uint64_t len = std::min<std::uint64_t>(kCanaryBytes, end - at);
    EXPECT_EQ(std::memcmp(base + at, want + at, len), 0) << "the canary bytes of the piece at " << at;
  }
  ASSERT_TRUE(bank->unplace().ok());
}

// A backend whose registered ranges a driver pins (as cuda's): no lazy host ranges.
class PinsWhatItRegisters final : public ForwardingBackend {
 public:
  explicit PinsWhatItRegisters(Backend& inner) : ForwardingBackend(inner), info_(inner.info()) {
    info_.lazy_host_ranges = false;
  }
  const DeviceInfo& info() const noexcept override { return info_; }

 private:
  DeviceInfo info_;
};

TEST(LazyBank, IsRegisteredOnlyOnTheSim) {
  auto sim = make_sim_backend({*find_profile("tiny"), 7, {}});
  PinsWhatItRegisters cuda(*sim);
  StreamOrder order(cuda);
  DevicePool pool(order);
  HostArena arena(order);
  TransferEngine engine(pool, arena, {});
  auto bank = WeightBank::synthetic(synthetic_spec(), "lazy", SyntheticStorage::lazy);
  ASSERT_TRUE(bank.ok());
  auto placed = bank->place(engine, BankPlacement::registered);
  ASSERT_FALSE(placed.ok());
  EXPECT_EQ(placed.error().code, ErrorCode::unsupported);
  EXPECT_FALSE(bank->placed());
  // In the arena every tensor is generated into its own block: any backend.
  ASSERT_TRUE(bank->place(engine, BankPlacement::arena).ok());
  for (std::size_t i = 0; i < bank->tensors().size(); ++i) EXPECT_EQ(content_hash(bank->bytes(i)), bank->hash(i));
  ASSERT_TRUE(bank->unplace().ok());
}

// Streams a model 24x the size of one tensor through a sim engine, two tensors in
// flight (the next one's upload begun before this one is finished, as
// dense-stream does): every tensor lands right, and the bank never holds more
// than the two in flight plus its kept canary page — the bound that a bank
// generated whole (resident again) breaks at once.
class LazyBankStreaming : public ::testing::TestWithParam<IntegrityPolicy> {};

TEST_P(LazyBankStreaming, HostMemoryIsBoundedByWhatIsInFlight) {
  constexpr std::uint64_t kTensor = std::uint64_t{2} << 20, kCount = 24;
  std::vector<SyntheticTensor> spec;
  for (std::uint64_t i = 0; i < kCount; ++i) {
    spec.push_back({"layer." + std::to_string(i), DType::bf16, {kTensor / 2}, 100 + i, Pattern::small_bf16});
  }
  auto bank = WeightBank::synthetic(spec, "lazy", SyntheticStorage::lazy);
  ASSERT_TRUE(bank.ok());
  auto sim = make_sim_backend({*find_profile("h200"), 7, {}});
  StreamOrder order(*sim);
  DevicePool pool(order);
  HostArena arena(order);
  EngineOptions eo;
  eo.policy = GetParam();
  TransferEngine engine(pool, arena, eo);
  ASSERT_TRUE(engine.status().ok());
  ASSERT_TRUE(bank->place(engine, BankPlacement::registered).ok());
  const std::uint64_t kept = bank->stats().resident_bytes;
  EXPECT_EQ(kept, 4096u) << "one registered piece: its first page is kept for canaries";

  struct InFlight {
    DeviceHandle dst;
    StagedRange range;
    PendingUpload pending;
  };
  const auto begin = [&](std::size_t i) -> InFlight {
    auto h = pool.allocate(kTensor, 1);
    EXPECT_TRUE(h.ok());
    auto r = bank->stage(i, 0, kTensor);
    EXPECT_TRUE(r.ok());
    TransferPlan plan;
    plan.add(r->bytes.data(), *h, 0, kTensor);
    auto p = engine.begin_upload(1, plan);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return InFlight{*h, *r, std::move(*p)};
  };
  std::optional<InFlight> next = begin(0);
  const std::byte* second = nullptr;  // tensor 1's staged bytes
  for (std::size_t i = 0; i < kCount; ++i) {
    InFlight cur = std::move(*next);
    if (i == 1) second = cur.range.bytes.data();
    next.reset();
    if (i + 1 < kCount) next = begin(i + 1);
    auto receipt = engine.finish(std::move(cur.pending));
    ASSERT_TRUE(receipt.ok()) << receipt.error().message;
    bank->release(cur.range, receipt->done);
    ASSERT_TRUE(order.wait(receipt->done).ok());
    std::vector<std::byte> got(kTensor);
    ASSERT_TRUE(sim->peek(pool.resolve(cur.dst)->addr, got).ok());
    EXPECT_EQ(content_hash(got), bank->hash(i)) << "tensor " << i;
    ASSERT_TRUE(pool.free(cur.dst).ok());
  }
  ASSERT_TRUE(sim->synchronize().ok());
  const BankStats st = bank->stats();
  EXPECT_EQ(st.generated_bytes, kCount * kTensor);
  EXPECT_EQ(st.dropped, kCount);
  EXPECT_EQ(st.resident_bytes, kept) << "every staged range was dropped once its transfer completed";
  EXPECT_LE(st.peak_resident_bytes, 2 * kTensor + kept);
  // The pages themselves went back to the kernel, not only the count.
  std::vector<unsigned char> in_core(kTensor / 4096);
  ASSERT_EQ(mincore(const_cast<std::byte*>(second), kTensor, in_core.data()), 0);
  EXPECT_EQ(std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return (c & 1) != 0; }), 0);
  const IntegrityCounters c = engine.counters();
  EXPECT_EQ(c.canary_failures, 0u);
  EXPECT_EQ(c.mismatches, 0u);
  if (GetParam() == IntegrityPolicy::verify) {
    EXPECT_EQ(c.bytes_verified, kCount * kTensor);
  }
  ASSERT_TRUE(bank->unplace().ok());
  EXPECT_EQ(bank->stats().resident_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, LazyBankStreaming,
                         ::testing::Values(IntegrityPolicy::verify, IntegrityPolicy::probe, IntegrityPolicy::off),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(WeightBank, PlacementNames) {
  EXPECT_EQ(parse_bank_placement("arena").value_or(BankPlacement::registered), BankPlacement::arena);
  EXPECT_FALSE(parse_bank_placement("pinned").ok());
}

}  // namespace
}  // namespace ferry

// The restricted unpickler: plain data in, every naming or calling opcode
// refused with its name and byte offset, bounded on hostile input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "import/pickle.hpp"

namespace ferry::import {
namespace {

std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  return out;
}

// pickle.dumps({'a': [1, -2, 3.5, None, True, 'xy', b'z', 2**64-1, -2**63, 2**64, (1, 2)]}, protocol=4)
const std::string kProtocol4 = from_hex(
    "8004954d000000000000007d948c0161945d94284b014afeffffff47400c0000000000004e888c0278799443017a948a09ffffff"
    "ffffffffff008a0800000000000000808a090000000000000000014b014b02869465732e");

std::vector<Value> items(const Tree& t, Value v) {
  std::vector<Value> out;
  t.for_each(v, [&](Value x) {
    out.push_back(x);
    return true;
  });
  return out;
}

TEST(Unpickle, ReadsPlainDataOfProtocol4) {
  Result<Tree> t = unpickle(kProtocol4);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_EQ(t->root().kind(), Kind::dict);
  const std::optional<Value> a = t->find(t->root(), "a");
  ASSERT_TRUE(a);
  const std::vector<Value> v = items(*t, *a);
  ASSERT_EQ(v.size(), 11u);
  EXPECT_EQ(t->integer(v[0])->magnitude, 1u);
  EXPECT_TRUE(t->integer(v[1])->negative);
  EXPECT_EQ(t->integer(v[1])->magnitude, 2u);
  EXPECT_EQ(*t->real(v[2]), 3.5);
  EXPECT_EQ(v[3].kind(), Kind::none);
  EXPECT_EQ(*t->boolean(v[4]), true);
  EXPECT_EQ(*t->string(v[5]), "xy");
  EXPECT_EQ(v[6].kind(), Kind::bytes);
  EXPECT_EQ(t->integer(v[7])->magnitude, ~std::uint64_t{0});
  EXPECT_FALSE(t->integer(v[7])->negative);
  EXPECT_TRUE(t->integer(v[8])->negative);
  EXPECT_EQ(t->integer(v[8])->magnitude, std::uint64_t{1} << 63);
  EXPECT_FALSE(t->integer(v[9])->in_range);  // 2**64
  ASSERT_EQ(v[10].kind(), Kind::tuple);
  EXPECT_EQ(t->size(v[10]), 2u);
}

TEST(Unpickle, SharedValuesThroughTheMemoAreOneValue) {
  // x = [1]; pickle.dumps([x, x], protocol=4): the second is a BINGET of the first.
  const std::string p = from_hex("8004950c000000000000005d94285d944b01616801652e");
  Result<Tree> t = unpickle(p);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const std::vector<Value> v = items(*t, t->root());
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], v[1]);
}

void expect_refused(const std::string& bytes, const std::string& needle) {
  Result<Tree> t = unpickle(bytes);
  ASSERT_FALSE(t.ok()) << "accepted: " << needle;
  EXPECT_EQ(t.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
}

TEST(Unpickle, RefusesEveryOpcodeThatNamesOrCalls) {
  const std::string head = "\x80\x04";
  // GLOBAL 'os\nsystem\n' at byte 2.
  expect_refused(head + "cos\nsystem\n" + "\x8c\x02id\x85R.", "byte 2: opcode GLOBAL (0x63)");
  // STACK_GLOBAL after two strings: byte 8.
  expect_refused(head + "\x8c\x02os\x8c\x06system\x93", "byte 14: opcode STACK_GLOBAL (0x93)");
  // REDUCE of two plain values (no GLOBAL before it): still refused by name.
  expect_refused(head + "]\x29R.", "byte 4: opcode REDUCE (0x52)");
  for (const char op : {'b', 'i', 'o', 'P', 'Q'}) {
    expect_refused(head + "N" + std::string(1, op), "byte 3: opcode ");
  }
  for (const int op : {0x81, 0x82, 0x83, 0x84, 0x92}) {
    expect_refused(head + "N" + std::string(1, static_cast<char>(op)), "byte 3: opcode ");
  }
  // Protocol 2 pickles bytes through _codecs.encode: refused at its GLOBAL.
  expect_refused(from_hex("8002635f636f646563730a656e636f64650a2e"), "byte 2: opcode GLOBAL");
}

TEST(Unpickle, RefusesTruncatedEmptyAndForeignInput) {
  expect_refused("", "empty");
  expect_refused("{\"op\":\"alloc\"}", "not a pickle");
  expect_refused(std::string("\x80\x01N.", 4), "not a pickle");
  for (std::size_t n = 2; n < kProtocol4.size(); ++n) {
    Result<Tree> t = unpickle(std::string_view(kProtocol4).substr(0, n));
    EXPECT_FALSE(t.ok()) << "a prefix of " << n << " bytes was accepted";
  }
  expect_refused(std::string("\x80\x04\x8c\x09" "abc", 7), "truncated");
  expect_refused(std::string("\x80\x04h\x05.", 5), "memo index 5 was never set");
  expect_refused(std::string("\x80\x04" "a", 3), "finds fewer than 2 items");
  expect_refused(std::string("\x80\x04" "Ne.", 4), "finds no MARK");
  expect_refused(std::string("\x80\x04" "K\x01" "K\x02" "a.", 7), "applies to a list, not to a int");
}

TEST(Unpickle, DeepNestingNeedsNoRecursion) {
  // 200000 nested lists: EMPTY_LIST pushed, then each appended into the one below.
  const std::size_t depth = 200000;
  std::string p = "\x80\x04";
  p.append(depth, ']');
  p.append(depth - 1, 'a');
  p += '.';
  Result<Tree> t = unpickle(p);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->size(t->root()), 1u);
  EXPECT_LE(t->tree_bytes(), 64 * p.size());
}

// Takes what is appended to the first list made (the root); keeps a memoized
// one-item list as 42 and nothing else.
class RootSink final : public AppendSink {
 public:
  bool take(const Tree& tree, Value list, const Value* items, std::size_t count) override {
    if (Tree::container_id(list) != 0) return false;
    for (std::size_t i = 0; i < count; ++i) {
      taken.push_back(items[i].kind());
      if (tree.external(items[i])) externals.push_back(*tree.external(items[i]));
    }
    return true;
  }
  std::optional<std::uint64_t> keep(const Tree& tree, Value v) override {
    if (tree.size(v) == 1) return 42;
    return std::nullopt;
  }
  std::vector<Kind> taken;
  std::vector<std::uint64_t> externals;
};

TEST(Unpickle, AnAppendSinkTakesBatchesAndTheirStorageIsGivenBack) {
  // root = []; a = [7]; b = []: root gets MARK a b APPENDS, then MARK a-again APPENDS.
  const std::string head = from_hex("80045d94285d944b07615d9465");
  RootSink sink;
  Result<Tree> t = unpickle(head + from_hex("286801652e"), &sink);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(sink.taken, (std::vector<Kind>{Kind::list, Kind::list, Kind::external}));
  EXPECT_EQ(sink.externals, std::vector<std::uint64_t>{42});
  EXPECT_EQ(t->size(t->root()), 0u);
  Result<Tree> bare = unpickle(std::string("\x80\x04].", 4));
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(t->tree_bytes(), bare->tree_bytes());  // a, b and their items were given back

  // b was not kept: a reference to it after its batch is refused, not a dangling value.
  RootSink again;
  Result<Tree> gone = unpickle(head + from_hex("286802652e"), &again);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message.find("memo index 2 names a value inside a history entry already read"),
            std::string::npos)
      << gone.error().message;

  // Without a sink the same bytes are a plain tree.
  Result<Tree> plain = unpickle(head + from_hex("286802652e"));
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain->size(plain->root()), 3u);
}

TEST(Unpickle, StorageAnOlderValueReachesIsNotGivenBack) {
  // root = []; old = []; MARK, old grows (BINGET old, 5, APPEND), then 6 is
  // appended to root by APPENDS: the batch grew an older list, so its storage
  // stays, and old (the pickle's result) is whole.
  const std::string p = from_hex("80045d945d94302868014b0561304b066568012e");
  RootSink sink;
  Result<Tree> t = unpickle(p, &sink);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(sink.taken, std::vector<Kind>{Kind::integer});
  const std::vector<Value> v = items(*t, t->root());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(t->integer(v[0])->magnitude, 5u);
}

TEST(Unpickle, HostileMemoIndexIsBoundedByTheInput) {
  expect_refused(std::string("\x80\x04N\x72\xff\xff\xff\x7f.", 9), "out of reach");
}

}  // namespace
}  // namespace ferry::import

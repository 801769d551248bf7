// The restricted pickle reader: plain data parses, allow-listed globals are recorded (never run),
// everything else is refused naming the global or opcode and its byte offset.
#include "interop/pickle.h"

#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

namespace savepoint::interop {
namespace {

using namespace std::string_literals;

PickleOptions Allow() {
  return {.globals = {{"torch.Size", GlobalRole::kCallable},
                      {"torch.float32", GlobalRole::kConstant},
                      {"m.C", GlobalRole::kClass}}};
}

TEST(Pickle, PlainDataAndRecordedCalls) {
  // {'a': (1, -2, 'x'), 'b': torch.Size((3,)), 'c': C() with state {'k': torch.float32}}
  const std::string p =
      "\x80\x04}(\x8c\x01"
      "a"
      "K\x01J\xfe\xff\xff\xff\x8c\x01x\x87"
      "\x8c\x01"
      "b"
      "\x8c\x05torch\x8c\x04Size\x93K\x03\x85\x85R"
      "\x8c\x01"
      "c"
      "\x8c\x01m\x8c\x01"
      "C\x93)\x81}\x8c\x01k\x8c\x05torch\x8c\x07"
      "float32\x93sbu."s;
  Result<Pickle> r = Pickle::Parse(p, Allow(), "t");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Pickle& k = *r;
  const Pickle::Node* a = k.Get(k.root(), "a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 3u);
  EXPECT_EQ(k.at(a->items[1]).i, -2);
  EXPECT_EQ(k.at(a->items[2]).s, "x");
  const Pickle::Node* b = k.Get(k.root(), "b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->kind, Pickle::Kind::kObject);
  EXPECT_EQ(b->s, "torch.Size");
  ASSERT_EQ(k.Args(*b).size(), 1u);
  EXPECT_EQ(k.at(k.at(k.Args(*b)[0]).items[0]).i, 3);
  const Pickle::Node* c = k.Get(k.root(), "c");
  ASSERT_NE(c, nullptr);
  const Pickle::Node* f = k.Field(*c, "k");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->s, "torch.float32");
}

TEST(Pickle, RefusesWhatItDoesNotKnow) {
  struct Case {
    std::string bytes, want;
  };
  const Case cases[] = {
      {"cposix\nsystem\n(S'x'\ntR."s, "refusing global \"posix.system\" at byte 0"},
      {"\x80\x04\x8c\x08"
       "builtins\x8c\x04"
       "eval\x93."s,
       "refusing global \"builtins.eval\" at byte 18"},
      {"\x80\x02\x63torch\nfloat32\n)R."s, "refusing REDUCE of \"torch.float32\""},
      {"\x80\x02\x63torch\nSize\n)\x81."s, "refusing NEWOBJ of \"torch.Size\""},
      {"\x80\x02S'x'\n."s, "opcode 0x53 at byte 2 is not allowed"},
      {"\x80\x02\x8b\x00\x00\x00\x01."s, "opcode 0x8b"},
      {"\x80\x02N\x51."s, "persistent id at byte 3"},
      {"\x80\x02" + std::string(70, ']') + std::string(69, 'a') + ".", "nested deeper than 64"},
      {"\x80\x02h\x05."s, "memo key 5"},
      {"\x80\x02X\xff\xff\xff\x7f."s, "truncated"},
      {"\x80\x02NN."s, "STOP with a stack"},
      {"\x80\x02N"s, "ends without STOP"},
  };
  for (const Case& c : cases) {
    Result<Pickle> r = Pickle::Parse(c.bytes, Allow(), "t");
    ASSERT_FALSE(r.ok()) << c.want;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().ToString();
  }
}

// newobj_reduce_shared_args (fuzz/corpus/dcp): one memoized tuple of n items, the arguments of n
// REDUCEs and NEWOBJs, was copied into each object: n^2 ids (for 180 KB of `.metadata`, 3.5 GB).
// The objects share it.
TEST(Pickle, MemoizedArgumentTupleIsSharedByNewObjAndReduce) {
  constexpr int kN = 20000;
  std::string p =
      "\x80\x02](cm\nC\nq\x00"s + "ctorch\nSize\nq\x01(" + std::string(kN, 'N') + "tq\x02";
  for (int i = 0; i < kN; ++i) p += i % 2 == 0 ? "h\x01h\x02R"s : "h\x00h\x02\x81"s;
  p += "e.";
  Result<Pickle> r = Pickle::Parse(p, Allow(), "t");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<Pickle::Id>& list = r->root().items;
  ASSERT_EQ(list.size(), 3u + kN);
  const std::vector<Pickle::Id>& args = r->at(list[2]).items;
  ASSERT_EQ(args.size(), size_t{kN});
  for (size_t i = 3; i < list.size(); ++i) {
    const Pickle::Node& object = r->at(list[i]);
    ASSERT_EQ(object.s, i % 2 == 1 ? "torch.Size" : "m.C");
    ASSERT_EQ(&r->Args(object), &args);
  }
  EXPECT_TRUE(r->Args(r->root()).empty());  // not an object
}

// A pickle of a list: the dict {key_0: 0, ..., key_<n-1>: n-1 (mod 256)} plus `extra` (opcodes
// adding more items), memoized as 0, then `objects` instances of m.C whose BUILD state is that
// dict (through the memo).
std::string SharedStateDict(int n, const std::string& extra, int objects) {
  std::string p = "\x80\x02](}q\x00("s;
  for (int i = 0; i < n; ++i) {
    const std::string key = "key_" + std::to_string(i);
    p += "X"s + static_cast<char>(key.size()) + "\0\0\0"s + key + "K" + static_cast<char>(i % 256);
  }
  const std::string build_from_memo_0 = "h\x00"s + "b";
  p += "u" + extra + "cm\nC\nq\x01)\x81" + build_from_memo_0;
  for (int i = 1; i < objects; ++i) p += "h\x01)\x81" + build_from_memo_0;
  return p + "e.";
}

// A dict's key is found the same whether the dict is indexed (kIndexedDictEntries entries or more)
// or searched: the first entry of a key wins, keys that are not strings are never matched.
TEST(Pickle, DictLookupIsTheSameIndexedOrNot) {
  for (int n : {3, int{Pickle::kIndexedDictEntries}, 100}) {
    SCOPED_TRACE(n);
    // Then key_1 again (-> 7) and the int 5 as a key (-> 9).
    Result<Pickle> r =
        Pickle::Parse(SharedStateDict(n, "\x8c\x05key_1K\x07sK\x05K\x09s"s, 2), Allow(), "t");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const Pickle::Node& object = r->at(r->root().items[1]);
    for (int i = 0; i < n; ++i) {
      const Pickle::Node* v = r->Field(object, "key_" + std::to_string(i));
      ASSERT_NE(v, nullptr) << i;
      EXPECT_EQ(v->i, i % 256);
    }
    EXPECT_EQ(r->Field(object, "key_"), nullptr);
    EXPECT_EQ(r->Field(object, "5"), nullptr);
    EXPECT_EQ(r->Field(object, "key_" + std::to_string(n)), nullptr);
  }
}

// A state dict of many entries shared by many objects through the memo (how a hostile DCP
// `.metadata` made lookups cost entries x objects): every object's fields are found.
TEST(Pickle, ManyObjectsSharingALargeStateDict) {
  constexpr int kN = 20000;
  Result<Pickle> r = Pickle::Parse(SharedStateDict(kN, "", kN), Allow(), "t");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<Pickle::Id>& list = r->root().items;
  ASSERT_EQ(list.size(), size_t{kN} + 1);
  for (Pickle::Id id : std::span(list).subspan(1)) {
    const Pickle::Node* v = r->Field(r->at(id), "key_19999");
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(v->i, 19999 % 256);
    ASSERT_EQ(r->Field(r->at(id), "absent"), nullptr);
  }
}

TEST(Pickle, SizeCap) {
  PickleOptions o = Allow();
  o.max_bytes = 4;
  EXPECT_EQ(Pickle::Parse("\x80\x02N."s + "    ", o, "t").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace savepoint::interop

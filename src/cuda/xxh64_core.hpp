// ferry — XXH64 and the content.hpp mixing and pattern functions, written once for
// host and device.
//
// Written from the public XXH64 specification (Yann Collet, xxHash "XXH64 algorithm
// description"). The device hash kernel and the host-side unit test both use these
// functions, so the test proves the code the GPU runs against libxxhash's XXH64.
//
// XXH64 keeps four accumulator lanes; lane t consumes word t of every 32-byte stripe.
// The lanes are independent until the end, which is why a group of four threads can
// hash one buffer: thread t runs lane_accumulate(..., t), then one thread converges
// the four lanes and hashes the tail (< 32 bytes) with finish().
//
// This header includes no CUDA header: under nvcc the functions are __host__
// __device__, under a plain C++ compiler they are ordinary inline functions.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__ __forceinline__
#else
#define FERRY_HD inline
#endif

namespace ferry::cuda_detail::xxh64 {

inline constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kPrime3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kPrime5 = 0x27D4EB2F165667C5ull;
inline constexpr std::uint64_t kStripe = 32;  // bytes consumed by the four lanes per step

FERRY_HD std::uint64_t rotl(std::uint64_t x, unsigned r) { return (x << r) | (x >> (64u - r)); }

// One lane step: the "round" of the specification.
FERRY_HD std::uint64_t lane_round(std::uint64_t acc, std::uint64_t input) {
  acc += input * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

FERRY_HD std::uint64_t merge_round(std::uint64_t acc, std::uint64_t lane) {
  acc ^= lane_round(0, lane);
  return acc * kPrime1 + kPrime4;
}

FERRY_HD std::uint64_t lane_init(std::uint64_t seed, unsigned lane) {
  switch (lane) {
    case 0: return seed + kPrime1 + kPrime2;
    case 1: return seed + kPrime2;
    case 2: return seed;
    default: return seed - kPrime1;
  }
}

// Little-endian loads that need no alignment.
FERRY_HD std::uint64_t load_le64_bytes(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
FERRY_HD std::uint32_t load_le32_bytes(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// A load of an 8-byte word; `aligned` says p is 8-byte aligned (the fast path).
FERRY_HD std::uint64_t load_word(const unsigned char* p, bool aligned) {
#if defined(__CUDA_ARCH__)
  if (aligned) return __ldg(reinterpret_cast<const unsigned long long*>(p));
  return load_le64_bytes(p);
#else
  (void)aligned;
  std::uint64_t v;
  std::memcpy(&v, p, 8);  // the host is little-endian (content.cpp asserts it)
  return v;
#endif
}

// Loads a device thread keeps in flight: the lanes are sequential chains, so memory
// latency is hidden by issuing a batch of loads before the rounds that consume them.
inline constexpr int kLoadBatch = 16;

// Lane `lane` (0..3) over `stripes` full stripes starting at p.
FERRY_HD std::uint64_t lane_accumulate(const unsigned char* p, std::uint64_t stripes,
                                       std::uint64_t seed, unsigned lane, bool aligned) {
  std::uint64_t acc = lane_init(seed, lane);
  const unsigned char* q = p + 8u * lane;
  std::uint64_t s = 0;
  for (; s + kLoadBatch <= stripes; s += kLoadBatch) {
    std::uint64_t w[kLoadBatch];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kLoadBatch; ++i) {
      w[i] = load_word(q + (s + static_cast<std::uint64_t>(i)) * kStripe, aligned);
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kLoadBatch; ++i) acc = lane_round(acc, w[i]);
  }
  for (; s < stripes; ++s) acc = lane_round(acc, load_word(q + s * kStripe, aligned));
  return acc;
}

// The four lanes folded into one value (inputs of 32 bytes or more).
FERRY_HD std::uint64_t converge(std::uint64_t v0, std::uint64_t v1, std::uint64_t v2,
                                std::uint64_t v3) {
  std::uint64_t h = rotl(v0, 1) + rotl(v1, 7) + rotl(v2, 12) + rotl(v3, 18);
  h = merge_round(h, v0);
  h = merge_round(h, v1);
  h = merge_round(h, v2);
  h = merge_round(h, v3);
  return h;
}

// Adds the total length, consumes the tail (tail_len < 32 bytes at `tail`) and
// avalanches. `h` is converge(...) when total_len >= 32, else seed + kPrime5.
FERRY_HD std::uint64_t finish(std::uint64_t h, const unsigned char* tail, std::uint64_t tail_len,
                              std::uint64_t total_len) {
  h += total_len;
  while (tail_len >= 8) {
    h ^= lane_round(0, load_le64_bytes(tail));
    h = rotl(h, 27) * kPrime1 + kPrime4;
    tail += 8;
    tail_len -= 8;
  }
  if (tail_len >= 4) {
    h ^= static_cast<std::uint64_t>(load_le32_bytes(tail)) * kPrime1;
    h = rotl(h, 23) * kPrime2 + kPrime3;
    tail += 4;
    tail_len -= 4;
  }
  while (tail_len > 0) {
    h ^= static_cast<std::uint64_t>(*tail) * kPrime5;
    h = rotl(h, 11) * kPrime1;
    ++tail;
    --tail_len;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

// Given the four lane values of a buffer, its XXH64. The lanes are ignored when the
// buffer is shorter than one stripe, exactly as the specification says.
FERRY_HD std::uint64_t from_lanes(const std::uint64_t (&v)[4], const unsigned char* p,
                                  std::uint64_t len, std::uint64_t seed) {
  const std::uint64_t body = len - len % kStripe;
  const std::uint64_t h = len >= kStripe ? converge(v[0], v[1], v[2], v[3]) : seed + kPrime5;
  return finish(h, p + body, len - body, len);
}

// Serial XXH64 of one buffer: the four lanes one after another.
FERRY_HD std::uint64_t hash(const void* data, std::uint64_t len, std::uint64_t seed,
                            bool aligned = false) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t v[4];
  for (unsigned t = 0; t < 4; ++t) v[t] = lane_accumulate(p, len / kStripe, seed, t, aligned);
  return from_lanes(v, p, len, seed);
}

// content.hpp's splitmix64 and mix_step, callable from device code.
FERRY_HD std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
FERRY_HD std::uint64_t mix_step(std::uint64_t acc, std::uint64_t k, std::uint64_t h) {
  return splitmix64(acc ^ h ^ k);
}

// content.hpp's small_bf16: one element's bf16 bits from its 16 bits of splitmix64.
FERRY_HD std::uint16_t small_bf16_element(std::uint32_t bits16) {
  switch (bits16 % 5u) {  // the value is bits16 % 5 - 2, as a bf16
    case 0: return 0xC000;  // -2
    case 1: return 0xBF80;  // -1
    case 2: return 0x0000;  //  0
    case 3: return 0x3F80;  //  1
    default: return 0x4000;  // 2
  }
}
// Word w (bytes [8w, 8w + 8), little-endian) of small_bf16(seed), given
// v = splitmix64(seed + w): element 4w + i comes from bits [16i, 16i + 16) of v.
FERRY_HD std::uint64_t small_bf16_word(std::uint64_t v) {
  std::uint64_t out = 0;
  for (unsigned i = 0; i < 4; ++i) {
    const auto bits16 = static_cast<std::uint32_t>((v >> (16u * i)) & 0xffffu);
    out |= static_cast<std::uint64_t>(small_bf16_element(bits16)) << (16u * i);
  }
  return out;
}

}  // namespace ferry::cuda_detail::xxh64

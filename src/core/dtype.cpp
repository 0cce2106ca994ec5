#include "baracuda/core/dtype.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace baracuda {
namespace {

constexpr std::array<DTypeInfo, kDTypeCount> kInfo{{
    {DType::f16, "f16", 16, DTypeClass::floating, true},
    {DType::bf16, "bf16", 16, DTypeClass::floating, true},
    {DType::f32, "f32", 32, DTypeClass::floating, true},
    {DType::f32_strict, "f32_strict", 32, DTypeClass::floating, true},
    {DType::f64, "f64", 64, DTypeClass::floating, true},
    {DType::i32, "i32", 32, DTypeClass::integer, true},
    {DType::i64, "i64", 64, DTypeClass::integer, true},
    {DType::boolean, "bool", 8, DTypeClass::boolean, false},
    {DType::s8, "s8", 8, DTypeClass::integer, true},
    {DType::u8, "u8", 8, DTypeClass::integer, false},
    {DType::s4, "s4", 4, DTypeClass::integer, true},
    {DType::u4, "u4", 4, DTypeClass::integer, false},
    {DType::bin, "bin", 1, DTypeClass::boolean, false},
    {DType::e4m3, "e4m3", 8, DTypeClass::floating, true},
    {DType::e5m2, "e5m2", 8, DTypeClass::floating, true},
    {DType::c64, "c64", 64, DTypeClass::complex, true},
    {DType::c128, "c128", 128, DTypeClass::complex, true},
}};

// A small binary floating-point format: `ebits` exponent bits, `mbits` mantissa bits.
// `finite_only` is the "fn" convention of e4m3: no infinities, all-ones exponent is a normal
// binade except the all-ones mantissa, which is NaN; overflow saturates to the largest finite.
struct MiniFloat {
  int ebits;
  int mbits;
  bool finite_only;
  int bias() const { return (1 << (ebits - 1)) - 1; }
  int emin() const { return 1 - bias(); }
  int emax() const { return finite_only ? (1 << ebits) - 1 - bias() : (1 << ebits) - 2 - bias(); }
  double max_finite() const {
    const double top_mant = finite_only ? 2.0 - 2.0 * std::ldexp(1.0, -mbits)  // 1.110 for e4m3
                                        : 2.0 - std::ldexp(1.0, -mbits);
    return std::ldexp(top_mant, emax());
  }
  uint32_t nan_bits() const {
    return finite_only ? ((1u << (ebits + mbits)) - 1u)
                       : (((1u << ebits) - 1u) << mbits) | (1u << (mbits - 1));
  }
  uint32_t inf_bits() const { return ((1u << ebits) - 1u) << mbits; }

  double decode(uint32_t bits) const {
    const uint32_t sign = (bits >> (ebits + mbits)) & 1u;
    const uint32_t exp = (bits >> mbits) & ((1u << ebits) - 1u);
    const uint32_t mant = bits & ((1u << mbits) - 1u);
    const double s = sign ? -1.0 : 1.0;
    const uint32_t all_ones = (1u << ebits) - 1u;
    if (finite_only) {
      if (exp == all_ones && mant == (1u << mbits) - 1u)
        return std::numeric_limits<double>::quiet_NaN();
    } else if (exp == all_ones) {
      return mant ? std::numeric_limits<double>::quiet_NaN()
                  : s * std::numeric_limits<double>::infinity();
    }
    if (exp == 0) return s * std::ldexp(static_cast<double>(mant), emin() - mbits);
    return s * std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -mbits),
                          static_cast<int>(exp) - bias());
  }

  // Round to nearest even, on the double's bits (frexp, ldexp and nearbyint were most of the test
  // harness's time encoding 33 M-element tensors). A NaN encodes as nan_bits(); past the largest
  // finite value, infinity or (finite_only) the largest finite. DType tests check every midpoint.
  uint32_t encode(double v) const {
    const uint32_t sign_bit = 1u << (ebits + mbits);
    if (std::isnan(v)) return nan_bits();
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    const uint32_t sign = (bits >> 63) != 0 ? sign_bit : 0u;
    const uint32_t overflow = finite_only ? (nan_bits() & ~sign_bit) - 1u : inf_bits();
    const int biased = static_cast<int>((bits >> 52) & 0x7FF);
    if (biased == 0x7FF) return sign | overflow;  // infinity
    if (biased == 0) return sign;  // zero, or a double subnormal: far below half the least quantum
    const uint64_t mant = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
    const int e = biased - 1023;  // v = mant 2^(e - 52)
    // The format's quantum at v is 2^(max(e, emin) - mbits): mant's bits below it round off.
    const int shift = 52 - mbits + std::max(0, emin() - e);
    if (shift >= 64) return sign;  // below a quarter of the least quantum
    uint64_t q = mant >> shift;
    const uint64_t rem = mant & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
    // A subnormal's code is its count of quanta (2^mbits of them carry into the least normal).
    if (e < emin()) return sign | static_cast<uint32_t>(q);
    int exp = e + bias();
    if ((q >> (mbits + 1)) != 0) q >>= 1, ++exp;  // rounded up to the next binade
    if (exp > emax() + bias()) return sign | overflow;
    const uint32_t code =
        (static_cast<uint32_t>(exp) << mbits) | (static_cast<uint32_t>(q) & ((1u << mbits) - 1u));
    return sign | (code > overflow ? overflow : code);  // e4m3: its all-ones code is NaN
  }
};

constexpr MiniFloat kF16{5, 10, false};
constexpr MiniFloat kBF16{8, 7, false};
constexpr MiniFloat kE4M3{4, 3, true};
constexpr MiniFloat kE5M2{5, 2, false};

// F's decode of every code of kBits bits, computed once: the CPU references and the test harness
// decode tens of millions of 16-bit elements, and decode's ldexp calls cost as much as the rest of
// a load (bf16 values() of 33 M elements 0.80 s against f32's 0.41 s).
template <const MiniFloat& F, int kBits>
double decoded(uint32_t bits) {
  static const std::vector<double> table = [] {
    std::vector<double> t(size_t{1} << kBits);
    for (size_t i = 0; i < t.size(); ++i) t[i] = F.decode(static_cast<uint32_t>(i));
    return t;
  }();
  return table[bits];
}

template <class T>
T read_as(const void* base, int64_t index) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + index * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return v;
}
template <class T>
void write_as(void* base, int64_t index, T v) {
  std::memcpy(static_cast<char*>(base) + index * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

template <class I>
I saturate_round(double v) {
  if (std::isnan(v)) return 0;
  const double lo = static_cast<double>(std::numeric_limits<I>::min());
  const double hi = static_cast<double>(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(std::nearbyint(v));
}

uint32_t read_bits(const void* base, int bits, int64_t index) {
  const auto* bytes = static_cast<const uint8_t*>(base);
  const int64_t bit = index * bits;
  return (bytes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
}
void write_bits(void* base, int bits, int64_t index, uint32_t value) {
  auto* bytes = static_cast<uint8_t*>(base);
  const int64_t bit = index * bits;
  const uint8_t mask = static_cast<uint8_t>(((1u << bits) - 1u) << (bit % 8));
  bytes[bit / 8] = static_cast<uint8_t>((bytes[bit / 8] & ~mask) | ((value << (bit % 8)) & mask));
}

}  // namespace

const DTypeInfo& info(DType t) {
  // A value past the bank (an integer cast to DType) reads as "invalid", never past the table, so
  // the error that refuses it can still print its name.
  static constexpr DTypeInfo kInvalid{static_cast<DType>(kDTypeCount), "invalid", 8,
                                      DTypeClass::integer, false};
  const auto i = static_cast<size_t>(t);
  return i < std::size(kInfo) ? kInfo[i] : kInvalid;
}

std::optional<DType> dtype_from_name(std::string_view n) {
  for (const auto& i : kInfo)
    if (i.name == n) return i.dtype;
  return std::nullopt;
}

double f16_to_double(uint16_t b) {
  return decoded<kF16, 16>(b);
}
double bf16_to_double(uint16_t b) {
  return decoded<kBF16, 16>(b);
}
double e4m3_to_double(uint8_t b) {
  return decoded<kE4M3, 8>(b);
}
double e5m2_to_double(uint8_t b) {
  return decoded<kE5M2, 8>(b);
}
uint16_t f16_from_double(double v) {
  return static_cast<uint16_t>(kF16.encode(v));
}
uint16_t bf16_from_double(double v) {
  return static_cast<uint16_t>(kBF16.encode(v));
}
uint8_t e4m3_from_double(double v) {
  return static_cast<uint8_t>(kE4M3.encode(v));
}
uint8_t e5m2_from_double(double v) {
  return static_cast<uint8_t>(kE5M2.encode(v));
}

std::complex<double> load_as_complex(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::c64: {
      auto v = read_as<std::complex<float>>(base, i);
      return {v.real(), v.imag()};
    }
    case DType::c128:
      return read_as<std::complex<double>>(base, i);
    default:
      return {load_as_double(base, t, i), 0.0};
  }
}

void store_from_complex(void* base, DType t, int64_t i, std::complex<double> v) {
  switch (t) {
    case DType::c64:
      write_as(base, i,
               std::complex<float>(static_cast<float>(v.real()), static_cast<float>(v.imag())));
      return;
    case DType::c128:
      write_as(base, i, v);
      return;
    default:
      store_from_double(base, t, i, v.real());
  }
}

double load_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f16:
      return decoded<kF16, 16>(read_as<uint16_t>(base, i));
    case DType::bf16:
      return decoded<kBF16, 16>(read_as<uint16_t>(base, i));
    case DType::f32:
    case DType::f32_strict:
      return read_as<float>(base, i);
    case DType::f64:
      return read_as<double>(base, i);
    case DType::i32:
      return read_as<int32_t>(base, i);
    case DType::i64:
      return static_cast<double>(read_as<int64_t>(base, i));
    case DType::boolean:
      return read_as<uint8_t>(base, i) != 0 ? 1.0 : 0.0;
    case DType::s8:
      return read_as<int8_t>(base, i);
    case DType::u8:
      return read_as<uint8_t>(base, i);
    case DType::s4: {
      const int v = static_cast<int>(read_bits(base, 4, i));
      return v >= 8 ? v - 16 : v;
    }
    case DType::u4:
      return read_bits(base, 4, i);
    case DType::bin:
      return read_bits(base, 1, i);
    case DType::e4m3:
      return decoded<kE4M3, 8>(read_as<uint8_t>(base, i));
    case DType::e5m2:
      return decoded<kE5M2, 8>(read_as<uint8_t>(base, i));
    case DType::c64:
      return read_as<std::complex<float>>(base, i).real();
    case DType::c128:
      return read_as<std::complex<double>>(base, i).real();
  }
  return 0.0;
}

void store_from_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f16:
      write_as(base, i, static_cast<uint16_t>(kF16.encode(v)));
      return;
    case DType::bf16:
      write_as(base, i, static_cast<uint16_t>(kBF16.encode(v)));
      return;
    case DType::f32:
    case DType::f32_strict:
      write_as(base, i, static_cast<float>(v));
      return;
    case DType::f64:
      write_as(base, i, v);
      return;
    case DType::i32:
      write_as(base, i, saturate_round<int32_t>(v));
      return;
    case DType::i64:
      write_as(base, i, saturate_round<int64_t>(v));
      return;
    case DType::boolean:
      write_as(base, i, static_cast<uint8_t>(v != 0.0));
      return;
    case DType::s8:
      write_as(base, i, saturate_round<int8_t>(v));
      return;
    case DType::u8:
      write_as(base, i, saturate_round<uint8_t>(v));
      return;
    case DType::s4: {
      const double c = std::fmin(7.0, std::fmax(-8.0, std::nearbyint(v)));
      write_bits(base, 4, i, static_cast<uint32_t>(static_cast<int>(c)) & 0xFu);
      return;
    }
    case DType::u4: {
      const double c = std::fmin(15.0, std::fmax(0.0, std::nearbyint(v)));
      write_bits(base, 4, i, static_cast<uint32_t>(c));
      return;
    }
    case DType::bin:
      write_bits(base, 1, i, v != 0.0 ? 1u : 0u);
      return;
    case DType::e4m3:
      write_as(base, i, static_cast<uint8_t>(kE4M3.encode(v)));
      return;
    case DType::e5m2:
      write_as(base, i, static_cast<uint8_t>(kE5M2.encode(v)));
      return;
    case DType::c64:
    case DType::c128:
      store_from_complex(base, t, i, {v, 0.0});
      return;
  }
}

double round_to(DType t, double v) {
  if (t == DType::f64 || t == DType::c128) return v;
  unsigned char scratch[16] = {};
  store_from_double(scratch, t, 0, v);
  return load_as_double(scratch, t, 0);
}

}  // namespace baracuda

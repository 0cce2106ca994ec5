// CUDA kernels of the gated family. Paths, picked per run from the actual views (choose_path):
//  - rows: every operand unit-stride along the (collapsed) innermost axis, 16-byte aligned rows.
//    Each thread moves whole 16-byte vectors of a, b (and dy) and writes whole vectors of y (or
//    da, db). The gate is a template parameter so the formula is inlined without a branch. The
//    kernel per (dtype, direction, alignment) comes from a table (rows_kernel_for): the legacy
//    grid-stride kernel (forward_rows) or the tiles kernel, which also takes rows_unaligned: rows
//    at the same address mod 16 bytes in every operand, only the slots crossing a row's ends going
//    element by element.
//  - pairs: a and b interleaved (gpt-oss layout), 16-byte loads of pairs.
//  - strided: any strides (odd interleavings, operands misaligned differently, broadcast inner
//    axes); one element per thread per step, the gate chosen by a warp-uniform switch.
// All grid-stride over the work with a grid sized to the chip, and all evaluate the same
// gate_math.hpp function per element, so their results are bitwise identical.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/cuda/launch.cuh"
#include "ops/gated/gate_math.hpp"
#include "ops/gated/gated_internal.hpp"

namespace baracuda::gated {

template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Storage <-> compute type (f64 stays f64; the 16-bit types and f32 compute in f32).
template <class T>
__device__ __forceinline__ compute_t<T> widen(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return cuda::to_float(v);
  }
}
template <class T>
__device__ __forceinline__ T narrow(compute_t<T> v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return cuda::from_float<T>(v);
  }
}

// The collapsed views as a plain kernel parameter.
struct DevViews {
  int rank;
  int64_t shape[kMaxRank];
  char* ptr[5];
  int64_t stride[5][kMaxRank];
};

inline DevViews to_device(const Views& v) {
  DevViews d{};
  d.rank = v.rank;
  for (int i = 0; i < v.rank; ++i) d.shape[i] = v.shape[i];
  for (int k = 0; k < v.count; ++k) {
    d.ptr[k] = v.ptr[k];
    for (int i = 0; i < v.rank; ++i) d.stride[k][i] = v.stride[k][i];
  }
  return d;
}

// q = x / d, r = x % d; 32-bit arithmetic when both fit (the common case), which is several
// times cheaper than the 64-bit division routine.
__device__ __forceinline__ void divmod(int64_t x, int64_t d, int64_t* q, int64_t* r) {
  if (((static_cast<uint64_t>(x) | static_cast<uint64_t>(d)) >> 32) == 0) {
    const uint32_t q32 = static_cast<uint32_t>(x) / static_cast<uint32_t>(d);
    *q = q32;
    *r = x - static_cast<int64_t>(q32) * d;
  } else {
    *q = x / d;
    *r = x - *q * d;
  }
}

// Element offsets of linear index `i` over dims [0, ndims) for the first N operands.
template <int N>
__device__ __forceinline__ void offsets_of(const DevViews& v, int ndims, int64_t i,
                                           int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = ndims - 1; d > 0; --d) {
    int64_t q, r;
    divmod(i, v.shape[d], &q, &r);
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += r * v.stride[k][d];
    i = q;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] += i * v.stride[k][0];
}

template <class T>
struct alignas(16) Vec {
  static constexpr int n = 16 / static_cast<int>(sizeof(T));
  T v[n];
};
// Half a vector: the outputs of one 16-byte vector of interleaved pairs.
template <class T>
struct alignas(8) HalfVec {
  static constexpr int n = 8 / static_cast<int>(sizeof(T));
  T v[n];
};

template <class V, class Raw>
__device__ __forceinline__ V load_as(const char* p) {
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  V out;
  memcpy(&out, &raw, sizeof(Raw));
  return out;
}
template <class V, class Raw>
__device__ __forceinline__ void store_as(char* p, const V& v) {
  Raw raw;
  memcpy(&raw, &v, sizeof(Raw));
  *reinterpret_cast<Raw*>(p) = raw;
}
template <class T>
__device__ __forceinline__ Vec<T> load_vec(const char* p) {
  return load_as<Vec<T>, uint4>(p);
}
template <class T>
__device__ __forceinline__ void store_vec(char* p, const Vec<T>& v) {
  store_as<Vec<T>, uint4>(p, v);
}

constexpr int kThreads = 256;

// Each thread handles kUnroll vectors per grid-stride step, all loads issued before any math:
// more bytes in flight per thread than the occupancy alone gives.
constexpr int kUnroll = 2;

// ---- rows (legacy, commit 718446f): 16-byte aligned rows, kUnroll vectors a grid-stride apart
// `nvec` vectors per row; rows are indexed by the outer dims [0, rank-1). Kept as the
// benchmark's baseline (RowsKernel::legacy).
template <class T, Gate G>
__global__ void __launch_bounds__(256)
    forward_rows(DevViews v, int64_t nvec, int64_t total, GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  constexpr int n = Vec<T>::n;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < total;
       base += kUnroll * step) {
    Vec<T> a[kUnroll] = {}, b[kUnroll] = {};
    int64_t out[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * step;
      if (i >= total) continue;
      int64_t row, col, off[3];
      divmod(i, nvec, &row, &col);
      offsets_of<3>(v, v.rank - 1, row, off);
      const int64_t e = col * n;
      a[u] = load_vec<T>(v.ptr[Views::a] + (off[Views::a] + e) * sizeof(T));
      b[u] = load_vec<T>(v.ptr[Views::b] + (off[Views::b] + e) * sizeof(T));
      out[u] = off[Views::y] + e;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step >= total) continue;
      Vec<T> y;
#pragma unroll
      for (int j = 0; j < n; ++j)
        y.v[j] = narrow<T>(gate_forward<G, C>(widen(a[u].v[j]), widen(b[u].v[j]), p));
      store_vec<T>(v.ptr[Views::y] + out[u] * sizeof(T), y);
    }
  }
}

template <class T, Gate G>
__global__ void __launch_bounds__(256)
    backward_rows(DevViews v, int64_t nvec, int64_t total, GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  constexpr int n = Vec<T>::n;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < total;
       base += kUnroll * step) {
    Vec<T> a[kUnroll] = {}, b[kUnroll] = {}, dy[kUnroll] = {};
    int64_t oa[kUnroll] = {}, ob[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * step;
      if (i >= total) continue;
      int64_t row, col, off[5];
      divmod(i, nvec, &row, &col);
      offsets_of<5>(v, v.rank - 1, row, off);
      const int64_t e = col * n;
      a[u] = load_vec<T>(v.ptr[Views::a] + (off[Views::a] + e) * sizeof(T));
      b[u] = load_vec<T>(v.ptr[Views::b] + (off[Views::b] + e) * sizeof(T));
      dy[u] = load_vec<T>(v.ptr[Views::dy] + (off[Views::dy] + e) * sizeof(T));
      oa[u] = off[Views::da] + e;
      ob[u] = off[Views::db] + e;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step >= total) continue;
      Vec<T> da, db;
#pragma unroll
      for (int j = 0; j < n; ++j) {
        C ga, gb;
        gate_backward<G, C>(widen(a[u].v[j]), widen(b[u].v[j]), widen(dy[u].v[j]), p, &ga, &gb);
        da.v[j] = narrow<T>(ga);
        db.v[j] = narrow<T>(gb);
      }
      store_vec<T>(v.ptr[Views::da] + oa[u] * sizeof(T), da);
      store_vec<T>(v.ptr[Views::db] + ob[u] * sizeof(T), db);
    }
  }
}

// ---- tiles: the rows paths, aligned or not
// -------------------------------------------------------------------------------------------------
// Each row of `len` elements is cut into 16-byte slots at the row's own 16-byte boundaries: slot j
// covers elements [j*n - back, (j+1)*n - back), back = elements between the 16-byte boundary at or
// before the row's start and that start (0 for aligned rows; it varies from row to row with an odd
// pitch). Every operand has the same row misalignment (choose_path checks it), so a slot inside the
// row is one aligned 16-byte vector in every operand; the (at most two) slots that cross a row end
// go element by element. A tile is TileVecs * kThreads consecutive slots of ONE row (thread t takes
// slots t, t + kThreads, ...: coalesced, TileVecs independent vectors per operand in flight before
// any math). Per tile a thread computes one 64-bit base pointer per operand; within the tile every
// offset is a small 32-bit number. (4c8e64e's version kept a 64-bit offset per operand per slot
// plus the row-end state, 122 registers for bf16 forward: 2 blocks per SM and 63% of copy.)
// Vectors per thread per tile: 2 where registers are tight (16-bit types: 8 gate evaluations per
// vector; the backward: 3 operands in, 2 out), 4 for the f32/f64 forward (half the math per byte).
template <class T, bool Backward>
constexpr int kTileVecs = (sizeof(T) == 2 || Backward) ? 2 : 4;
// Registers capped (ptxas -v, sm_90a) at the tightest bound that does not spill more than a few
// bytes: 16-bit types 4 blocks of 256 threads per SM (64 per thread) forward, 3 (85) backward
// (5 operands; at 64 it spills ~100 bytes); f32 (4 vectors forward: 62 registers spill 32-64
// bytes) and f64 2 blocks (128), as 4c8e64e's f32 tiles kernel that reached 95-99% of copy.
template <class T, bool Backward>
constexpr int kTileMinBlocks = sizeof(T) != 2 ? 2
                               : Backward     ? 3
                                              : 4;

struct TileGrid {
  int64_t len;        // elements per row
  int64_t row_tiles;  // tiles per row
  int64_t tiles;      // rows * row_tiles
};

// Inputs are read once: streaming loads/stores (evict-first) keep them from displacing L2 lines
// that something else may still want.
template <class T>
__device__ __forceinline__ Vec<T> load_stream(const char* p) {
  const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(p));
  Vec<T> out;
  memcpy(&out, &raw, sizeof(raw));
  return out;
}
template <class T>
__device__ __forceinline__ void store_stream(char* p, const Vec<T>& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  __stcs(reinterpret_cast<uint4*>(p), raw);
}

// One tile of one row: base[k] points at the tile's first slot's first element in operand k (that
// element may lie before the row: the head slot of a misaligned row), elements [lo, hi) of the
// tile (in element offsets from base) lie inside the row.
template <int N>
struct Tile {
  char* base[N];
  int lo, hi;
};

template <class T, int N, int Vecs>
__device__ __forceinline__ Tile<N> tile_at(const DevViews& v, const TileGrid& g, int64_t tile) {
  constexpr int64_t n = Vec<T>::n, eb = sizeof(T);
  int64_t row, chunk, off[N];
  divmod(tile, g.row_tiles, &row, &chunk);
  offsets_of<N>(v, v.rank - 1, row, off);
  const auto addr = reinterpret_cast<uintptr_t>(v.ptr[Views::a] + off[Views::a] * eb);
  // The row's first 16-byte boundary at or before its start (addr - addr % 16) begins slot 0.
  const int64_t first = chunk * (Vecs * kThreads * n) - static_cast<int64_t>(addr % 16 / eb);
  Tile<N> t;
#pragma unroll
  for (int k = 0; k < N; ++k) t.base[k] = v.ptr[k] + (off[k] + first) * eb;
  const int64_t span = Vecs * kThreads * n, rest = g.len - first;
  t.lo = first < 0 ? static_cast<int>(-first) : 0;
  t.hi = static_cast<int>(rest < span ? rest : span);
  return t;
}

template <class T, Gate G>
__global__ void __launch_bounds__(kThreads, kTileMinBlocks<T, false>)
    forward_tiles(DevViews v, TileGrid g, GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  constexpr int n = Vec<T>::n, eb = sizeof(T), U = kTileVecs<T, false>;
  for (int64_t tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const Tile<3> t = tile_at<T, 3, U>(v, g, tile);
    Vec<T> a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = (u * kThreads + static_cast<int>(threadIdx.x)) * n;
      if (o < t.lo || o + n > t.hi) continue;
      a[u] = load_stream<T>(t.base[Views::a] + o * eb);
      b[u] = load_stream<T>(t.base[Views::b] + o * eb);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = (u * kThreads + static_cast<int>(threadIdx.x)) * n;
      if (o < t.lo || o + n > t.hi) continue;
      Vec<T> y;
#pragma unroll
      for (int j = 0; j < n; ++j)
        y.v[j] = narrow<T>(gate_forward<G, C>(widen(a[u].v[j]), widen(b[u].v[j]), p));
      store_stream<T>(t.base[Views::y] + o * eb, y);
    }
    // Slots crossing a row end: their elements inside the row, one at a time (rare: not unrolled).
#pragma unroll 1
    for (int u = 0; u < U; ++u) {
      const int o = (u * kThreads + static_cast<int>(threadIdx.x)) * n;
      if (o >= t.lo && o + n <= t.hi) continue;
      for (int j = max(o, t.lo); j < min(o + n, t.hi); ++j) {
        const C y =
            gate_forward<G, C>(widen(*reinterpret_cast<const T*>(t.base[Views::a] + j * eb)),
                               widen(*reinterpret_cast<const T*>(t.base[Views::b] + j * eb)), p);
        *reinterpret_cast<T*>(t.base[Views::y] + j * eb) = narrow<T>(y);
      }
    }
  }
}

template <class T, Gate G>
__global__ void __launch_bounds__(kThreads, kTileMinBlocks<T, true>)
    backward_tiles(DevViews v, TileGrid g, GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  constexpr int n = Vec<T>::n, eb = sizeof(T), U = kTileVecs<T, true>;
  for (int64_t tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const Tile<5> t = tile_at<T, 5, U>(v, g, tile);
    Vec<T> a[U], b[U], dy[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = (u * kThreads + static_cast<int>(threadIdx.x)) * n;
      if (o < t.lo || o + n > t.hi) continue;
      a[u] = load_stream<T>(t.base[Views::a] + o * eb);
      b[u] = load_stream<T>(t.base[Views::b] + o * eb);
      dy[u] = load_stream<T>(t.base[Views::dy] + o * eb);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int o = (u * kThreads + static_cast<int>(threadIdx.x)) * n;
      if (o < t.lo || o + n > t.hi) continue;
      Vec<T> da, db;
#pragma unroll
      for (int j = 0; j < n; ++j) {
        C ga, gb;
        gate_backward<G, C>(widen(a[u].v[j]), widen(b[u].v[j]), widen(dy[u].v[j]), p, &ga, &gb);
        da.v[j] = narrow<T>(ga);
        db.v[j] = narrow<T>(gb);
      }
      store_stream<T>(t.base[Views::da] + o * eb, da);
      store_stream<T>(t.base[Views::db] + o * eb, db);
    }
#pragma unroll 1
    for (int u = 0; u < U; ++u) {
      const int o = (u * kThreads + static_cast<int>(threadIdx.x)) * n;
      if (o >= t.lo && o + n <= t.hi) continue;
      for (int j = max(o, t.lo); j < min(o + n, t.hi); ++j) {
        C ga, gb;
        gate_backward<G, C>(widen(*reinterpret_cast<const T*>(t.base[Views::a] + j * eb)),
                            widen(*reinterpret_cast<const T*>(t.base[Views::b] + j * eb)),
                            widen(*reinterpret_cast<const T*>(t.base[Views::dy] + j * eb)), p, &ga,
                            &gb);
        *reinterpret_cast<T*>(t.base[Views::da] + j * eb) = narrow<T>(ga);
        *reinterpret_cast<T*>(t.base[Views::db] + j * eb) = narrow<T>(gb);
      }
    }
  }
}

// ---- pairs: a and b interleaved on the innermost axis (gpt-oss layout)
// --------------------------- One 16-byte load of x holds n/2 (a, b) pairs and gives n/2 outputs
// (an 8-byte store); the backward writes the pairs of dx back with one 16-byte store. `x`/`dx`
// point at the first element of the first pair; `gate_first` says whether that first element is b.
template <class T, Gate G>
__global__ void __launch_bounds__(256)
    forward_pairs(DevViews v, const char* x, bool gate_first, int64_t nvec, int64_t total,
                  GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  constexpr int m = HalfVec<T>::n;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < total;
       base += kUnroll * step) {
    Vec<T> xv[kUnroll] = {};
    int64_t out[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * step;
      if (i >= total) continue;
      int64_t row, col, off[3];
      divmod(i, nvec, &row, &col);
      offsets_of<3>(v, v.rank - 1, row, off);
      xv[u] = load_vec<T>(x + (off[Views::a] + 2 * m * col) * sizeof(T));
      out[u] = off[Views::y] + m * col;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step >= total) continue;
      HalfVec<T> y;
#pragma unroll
      for (int j = 0; j < m; ++j) {
        const C lo = widen(xv[u].v[2 * j]), hi = widen(xv[u].v[2 * j + 1]);
        y.v[j] = narrow<T>(gate_forward<G, C>(gate_first ? hi : lo, gate_first ? lo : hi, p));
      }
      store_as<HalfVec<T>, uint2>(v.ptr[Views::y] + out[u] * sizeof(T), y);
    }
  }
}

template <class T, Gate G>
__global__ void __launch_bounds__(256)
    backward_pairs(DevViews v, const char* x, char* dx, bool gate_first, int64_t nvec,
                   int64_t total, GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  constexpr int m = HalfVec<T>::n;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < total;
       base += kUnroll * step) {
    Vec<T> xv[kUnroll] = {};
    HalfVec<T> dy[kUnroll] = {};
    int64_t odx[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * step;
      if (i >= total) continue;
      int64_t row, col, off[5];
      divmod(i, nvec, &row, &col);
      offsets_of<5>(v, v.rank - 1, row, off);
      xv[u] = load_vec<T>(x + (off[Views::a] + 2 * m * col) * sizeof(T));
      dy[u] = load_as<HalfVec<T>, uint2>(v.ptr[Views::dy] + (off[Views::dy] + m * col) * sizeof(T));
      odx[u] = off[Views::da] + 2 * m * col;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step >= total) continue;
      Vec<T> g;
#pragma unroll
      for (int j = 0; j < m; ++j) {
        const C lo = widen(xv[u].v[2 * j]), hi = widen(xv[u].v[2 * j + 1]);
        C ga, gb;
        gate_backward<G, C>(gate_first ? hi : lo, gate_first ? lo : hi, widen(dy[u].v[j]), p, &ga,
                            &gb);
        g.v[2 * j] = narrow<T>(gate_first ? gb : ga);
        g.v[2 * j + 1] = narrow<T>(gate_first ? ga : gb);
      }
      store_vec<T>(dx + odx[u] * sizeof(T), g);
    }
  }
}

// ---- strided: any strides
// ------------------------------------------------------------------------
template <class C>
__device__ __forceinline__ C forward_any(Gate g, C a, C b, GateParams<C> p) {
  switch (g) {
    case Gate::glu:
      return gate_forward<Gate::glu, C>(a, b, p);
    case Gate::reglu:
      return gate_forward<Gate::reglu, C>(a, b, p);
    case Gate::swiglu:
      return gate_forward<Gate::swiglu, C>(a, b, p);
    case Gate::geglu_erf:
      return gate_forward<Gate::geglu_erf, C>(a, b, p);
    case Gate::geglu_tanh:
      return gate_forward<Gate::geglu_tanh, C>(a, b, p);
    case Gate::swiglu_clamped:
      return gate_forward<Gate::swiglu_clamped, C>(a, b, p);
    case Gate::bilinear:
      return gate_forward<Gate::bilinear, C>(a, b, p);
  }
  return C(0);
}

template <class C>
__device__ __forceinline__ void backward_any(Gate g, C a, C b, C dy, GateParams<C> p, C* da,
                                             C* db) {
  switch (g) {
    case Gate::glu:
      return gate_backward<Gate::glu, C>(a, b, dy, p, da, db);
    case Gate::reglu:
      return gate_backward<Gate::reglu, C>(a, b, dy, p, da, db);
    case Gate::swiglu:
      return gate_backward<Gate::swiglu, C>(a, b, dy, p, da, db);
    case Gate::geglu_erf:
      return gate_backward<Gate::geglu_erf, C>(a, b, dy, p, da, db);
    case Gate::geglu_tanh:
      return gate_backward<Gate::geglu_tanh, C>(a, b, dy, p, da, db);
    case Gate::swiglu_clamped:
      return gate_backward<Gate::swiglu_clamped, C>(a, b, dy, p, da, db);
    case Gate::bilinear:
      return gate_backward<Gate::bilinear, C>(a, b, dy, p, da, db);
  }
}

template <class T>
__global__ void __launch_bounds__(256)
    forward_strided(DevViews v, int64_t total, Gate g, GateParams<compute_t<T>> p) {
  const auto* a = reinterpret_cast<const T*>(v.ptr[Views::a]);
  const auto* b = reinterpret_cast<const T*>(v.ptr[Views::b]);
  auto* y = reinterpret_cast<T*>(v.ptr[Views::y]);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    offsets_of<3>(v, v.rank, i, off);
    y[off[Views::y]] =
        narrow<T>(forward_any(g, widen(a[off[Views::a]]), widen(b[off[Views::b]]), p));
  }
}

template <class T>
__global__ void __launch_bounds__(256)
    backward_strided(DevViews v, int64_t total, Gate g, GateParams<compute_t<T>> p) {
  using C = compute_t<T>;
  const auto* a = reinterpret_cast<const T*>(v.ptr[Views::a]);
  const auto* b = reinterpret_cast<const T*>(v.ptr[Views::b]);
  const auto* dy = reinterpret_cast<const T*>(v.ptr[Views::dy]);
  auto* da = reinterpret_cast<T*>(v.ptr[Views::da]);
  auto* db = reinterpret_cast<T*>(v.ptr[Views::db]);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[5];
    offsets_of<5>(v, v.rank, i, off);
    C ga, gb;
    backward_any(g, widen(a[off[Views::a]]), widen(b[off[Views::b]]), widen(dy[off[Views::dy]]), p,
                 &ga, &gb);
    da[off[Views::da]] = narrow<T>(ga);
    db[off[Views::db]] = narrow<T>(gb);
  }
}

// ---- host side
// -----------------------------------------------------------------------------------

// As many blocks as can be resident at once on every SM (the occupancy calculator knows the
// kernel's registers), never more than the work needs: one wave, then each thread grid-strides.
template <class Kernel>
Result<unsigned> grid_for(const LaunchContext& ctx, Kernel kernel, int64_t work, const char* what) {
  int per_sm = 0;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
      e != cudaSuccess)
    return cuda::cuda_error("gated", what, e);
  const int64_t sms = std::max(ctx.stream.caps().sm_count, 1);
  const int64_t blocks =
      std::min<int64_t>(cuda::ceil_div(work, kThreads), sms * std::max(per_sm, 1));
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

template <class C>
GateParams<C> params_of(const GatedProblem& p) {
  return {static_cast<C>(p.alpha), static_cast<C>(p.limit)};
}

// Launches `kernel` over `total` work items (kUnroll per thread per step) and checks the launch.
template <class Kernel, class... Args>
Status launch(const LaunchContext& ctx, std::string_view op, const char* what, Kernel kernel,
              int64_t total, Args... args) {
  const Result<unsigned> grid = grid_for(ctx, kernel, cuda::ceil_div(total, kUnroll), what);
  if (!grid.ok()) return grid.error();
  kernel<<<grid.value(), kThreads, 0, cuda::stream_of(ctx)>>>(args...);
  return cuda::check_launch(op, what);
}

// One instantiation per gate for the vectorized paths; these tables (not a switch) pick them.
template <class T>
struct GateTables {
  using C = compute_t<T>;
  using Rows = void (*)(DevViews, int64_t, int64_t, GateParams<C>);
  using Tiles = void (*)(DevViews, TileGrid, GateParams<C>);
  using FwdPairs = void (*)(DevViews, const char*, bool, int64_t, int64_t, GateParams<C>);
  using BwdPairs = void (*)(DevViews, const char*, char*, bool, int64_t, int64_t, GateParams<C>);
  template <template <class, Gate> class K, class F>
  static constexpr F table(int g) {
    constexpr F all[kGateCount] = {K<T, Gate::glu>::fn,        K<T, Gate::reglu>::fn,
                                   K<T, Gate::swiglu>::fn,     K<T, Gate::geglu_erf>::fn,
                                   K<T, Gate::geglu_tanh>::fn, K<T, Gate::swiglu_clamped>::fn,
                                   K<T, Gate::bilinear>::fn};
    return all[g];
  }
};
template <class T, Gate G>
struct FwdRowsK {
  static constexpr auto fn = forward_rows<T, G>;
};
template <class T, Gate G>
struct BwdRowsK {
  static constexpr auto fn = backward_rows<T, G>;
};
template <class T, Gate G>
struct FwdTilesK {
  static constexpr auto fn = forward_tiles<T, G>;
};
template <class T, Gate G>
struct BwdTilesK {
  static constexpr auto fn = backward_tiles<T, G>;
};
template <class T, Gate G>
struct FwdPairsK {
  static constexpr auto fn = forward_pairs<T, G>;
};
template <class T, Gate G>
struct BwdPairsK {
  static constexpr auto fn = backward_pairs<T, G>;
};

// The tile grid of the tiles kernel over a collapsed view (see forward_tiles): aligned rows hold
// len / n slots; a misaligned row of len elements touches at most (len + 2n - 2) / n slots.
template <class T, bool Backward>
TileGrid tiles_of(const Views& v, Path path) {
  constexpr int64_t n = Vec<T>::n, per_tile = kTileVecs<T, Backward> * kThreads;
  const int64_t len = v.shape[v.rank - 1];
  int64_t rows = 1;
  for (int d = 0; d + 1 < v.rank; ++d) rows *= v.shape[d];  // <= out_numel: no overflow
  const int64_t nslot = path == Path::rows ? len / n : (len + 2 * n - 2) / n;
  const int64_t row_tiles = cuda::ceil_div(nslot, per_tile);
  return {len, row_tiles, rows * row_tiles};
}

// The tiles kernel: one wave of blocks grid-striding over the tiles (RowsKernel::tiles), or one
// block per tile (RowsKernel::tiles_full_grid).
template <class Kernel, class Prm>
Status launch_tiles(const LaunchContext& ctx, std::string_view op, const char* what, Kernel kernel,
                    RowsKernel which, const DevViews& dv, const TileGrid& g, Prm prm) {
  unsigned grid = static_cast<unsigned>(std::min<int64_t>(g.tiles, (int64_t{1} << 31) - 1));
  if (which != RowsKernel::tiles_full_grid) {
    const Result<unsigned> r = grid_for(ctx, kernel, g.tiles * kThreads, what);
    if (!r.ok()) return r.error();
    grid = r.value();
  }
  kernel<<<grid, kThreads, 0, cuda::stream_of(ctx)>>>(dv, g, prm);
  return cuda::check_launch(op, what);
}

template <DType D, int kPin>
Status launch_forward(const LaunchContext& ctx, const GatedProblem& p,
                      const GatedForwardOp::Arguments& args) {
  using T = cuda::device_t<D>;
  using Tab = GateTables<T>;
  constexpr std::string_view op = GatedForwardOp::name;
  if (p.out_numel == 0) return {};
  Views v = forward_views(p, args);
  collapse(v);
  const DevViews dv = to_device(v);
  const auto prm = params_of<compute_t<T>>(p);
  const int g = static_cast<int>(p.gate);
  switch (const Path path = choose_path(v, D, false, pinned_rows_kernel(kPin))) {
    case Path::rows:
    case Path::rows_unaligned:
      // choose_path gives rows_unaligned only when the table picks a tiles kernel for it.
      if (const RowsKernel k =
              rows_kernel_for(D, false, path == Path::rows, pinned_rows_kernel(kPin));
          k != RowsKernel::legacy) {
        return launch_tiles(ctx, op, "forward_tiles",
                            Tab::template table<FwdTilesK, typename Tab::Tiles>(g), k, dv,
                            tiles_of<T, false>(v, path), prm);
      }
      {
        const int64_t nvec = v.shape[v.rank - 1] / Vec<T>::n, total = p.out_numel / Vec<T>::n;
        return launch(ctx, op, "forward_rows", Tab::template table<FwdRowsK, typename Tab::Rows>(g),
                      total, dv, nvec, total, prm);
      }
    case Path::pairs: {
      const PairBases pb = pairs_fit(v, sizeof(T), false);
      const int64_t nvec = v.shape[v.rank - 1] / HalfVec<T>::n, total = p.out_numel / HalfVec<T>::n;
      return launch(ctx, op, "forward_pairs",
                    Tab::template table<FwdPairsK, typename Tab::FwdPairs>(g), total, dv, pb.x,
                    pb.gate_first, nvec, total, prm);
    }
    case Path::strided:
      break;
  }
  return launch(ctx, op, "forward_strided", forward_strided<T>, p.out_numel * kUnroll, dv,
                p.out_numel, p.gate, prm);
}

template <DType D, int kPin>
Status launch_backward(const LaunchContext& ctx, const GatedProblem& p,
                       const GatedBackwardOp::Arguments& args) {
  using T = cuda::device_t<D>;
  using Tab = GateTables<T>;
  constexpr std::string_view op = GatedBackwardOp::name;
  if (p.out_numel == 0) return {};
  Views v = backward_views(p, args);
  collapse(v);
  const DevViews dv = to_device(v);
  const auto prm = params_of<compute_t<T>>(p);
  const int g = static_cast<int>(p.gate);
  switch (const Path path = choose_path(v, D, true, pinned_rows_kernel(kPin))) {
    case Path::rows:
    case Path::rows_unaligned:
      if (const RowsKernel k =
              rows_kernel_for(D, true, path == Path::rows, pinned_rows_kernel(kPin));
          k != RowsKernel::legacy) {
        return launch_tiles(ctx, op, "backward_tiles",
                            Tab::template table<BwdTilesK, typename Tab::Tiles>(g), k, dv,
                            tiles_of<T, true>(v, path), prm);
      }
      {
        const int64_t nvec = v.shape[v.rank - 1] / Vec<T>::n, total = p.out_numel / Vec<T>::n;
        return launch(ctx, op, "backward_rows",
                      Tab::template table<BwdRowsK, typename Tab::Rows>(g), total, dv, nvec, total,
                      prm);
      }
    case Path::pairs: {
      const PairBases pb = pairs_fit(v, sizeof(T), true);
      const int64_t nvec = v.shape[v.rank - 1] / HalfVec<T>::n, total = p.out_numel / HalfVec<T>::n;
      return launch(ctx, op, "backward_pairs",
                    Tab::template table<BwdPairsK, typename Tab::BwdPairs>(g), total, dv, pb.x,
                    pb.dx, pb.gate_first, nvec, total, prm);
    }
    case Path::strided:
      break;
  }
  return launch(ctx, op, "backward_strided", backward_strided<T>, p.out_numel * kUnroll, dv,
                p.out_numel, p.gate, prm);
}

// The forward and backward kernels of one dtype with the rows kernel from the table (priority 10,
// the default) or pinned (lower priorities: reached only through PlanPreference::kernel).
template <DType D, int kPin>
void register_direction_pair(int priority) {
  constexpr PrecisionGuarantee precision{D == DType::f64 ? MathPrecision::f64 : MathPrecision::f32,
                                         D == DType::f64 ? DType::f64 : DType::f32,
                                         /*deterministic=*/true, /*bit_stable=*/true};
  register_kernel<GatedForwardOp>({
      .sku = {.category = "activation",
              .op = "gated_forward",
              .element = D,
              .aux_element = D,
              .layout = "strided",
              .arch = Arch::sm80,
              .backend = Backend::bespoke_cuda,
              .precision = precision,
              .name = cuda_kernel_name(false, pinned_rows_kernel(kPin))},
      .priority = priority,
      .launch = launch_forward<D, kPin>,
  });
  register_kernel<GatedBackwardOp>({
      .sku = {.category = "activation",
              .op = "gated_backward",
              .element = D,
              .aux_element = D,
              .layout = "strided",
              .arch = Arch::sm80,
              .backend = Backend::bespoke_cuda,
              .precision = precision,
              .name = cuda_kernel_name(true, pinned_rows_kernel(kPin))},
      .priority = priority,
      .launch = launch_backward<D, kPin>,
  });
}

// Registers the CUDA kernels of one dtype (called from kernels_<dtype>.cu).
template <DType D>
bool register_cuda() {
  register_direction_pair<D, -1>(10);
  register_direction_pair<D, static_cast<int>(RowsKernel::legacy)>(3);
  register_direction_pair<D, static_cast<int>(RowsKernel::tiles)>(2);
  register_direction_pair<D, static_cast<int>(RowsKernel::tiles_full_grid)>(1);
  return true;
}

}  // namespace baracuda::gated

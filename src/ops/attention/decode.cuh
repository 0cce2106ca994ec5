// Flash-decoding for f16/bf16 (sm_80+): few query tokens (Lq <= 16) against a long KV cache.
//
// Decode is bound by the K/V bytes, so the design is about streaming them once at full bandwidth:
//  - One CTA per (batch, K/V head, key split) holds ALL query rows of the GQA group (group * Lq
//    rows, padded to m16 tiles), so each K/V tile is read from memory once per group instead of
//    once per query head.
//  - Splits are chosen so that every SM runs one CTA, in a single wave (flash_decode_sm80) or in
//    about four (flash_decode_w4_sm80, A/B: shorter splits the block scheduler balances); each
//    split owns a contiguous run of 64-key tiles.
//  - K/V tiles are streamed with 16-byte cp.async, 2..4 stages deep (48 to 64 KB in flight per
//    CTA): the memory system needs tens of KB in flight per SM to reach its bandwidth, and no
//    more (see decode_splits).
//  - All four warps compute: warp w takes keys [16w, 16w + 16) of every tile and keeps its own f32
//    online softmax (m, l, O); the warps' states are merged through shared memory at the end in
//    warp order, and the splits' normalized partials in split order: by flash_decode_combine (a
//    second launch) or, in flash_decode_fused_sm80, by one block of the group in the same launch
//    (split 0, or the last finisher; the default on sm_90 where decode_fused_leads holds). Every
//    order is fixed, so results are deterministic for a given plan (the split count depends on
//    the problem size and the device, so bits are not stable across batch sizes).
#pragma once

#include <atomic>

// Included by launch.cuh after its host helpers (fwd_params, rows_aligned, launch_fwd_simt).
#include "ops/attention/kernels.cuh"

namespace baracuda::attention::kernels {

// A stamp of the measurement build's CTA timeline (core/cuda/trace.cuh; nothing otherwise). Rows:
// the decode's CTAs by block index, then the combine's (decode_trace_ctas on). Slots: 0 start
// (past the dependency wait), 1 the key loop's end, 2 thread 0's partials stored, 3 the merge
// verdict (fused), 4 the merge's end (the merging block); the combine: 0 past its wait, 1 done.
__host__ __device__ __forceinline__ int decode_trace_ctas(const Params& p) {
  return static_cast<int>(int64_t{p.batch} * p.heads_kv * p.splits);
}
__device__ __forceinline__ void trace_stamp(const Params& p, int row, int slot) {
#if defined(BARACUDA_KERNEL_TRACE) && BARACUDA_KERNEL_TRACE
  p.trace.stamp(row, slot);
#endif
}

template <class T, int D, int MT>
struct DecodeCfg {
  static constexpr int kNW = 4, kThreads = 32 * kNW;
  static constexpr int kBN = 16 * kNW;  // keys per tile: 16 per warp
  static constexpr int kRows = 16 * MT;
  // Deeper rings where tiles are small: what matters is the bytes in flight per SM.
  static constexpr int kStages = D == 64 ? 4 : D == 128 ? 3 : 2;
  static constexpr int kLd = D + 8;  // f32 merge rows, padded so the 8 fragment rows spread banks
  static constexpr size_t kQBytes = sizeof(T) * size_t{kRows} * D;
  static constexpr size_t kKvBytes = sizeof(T) * 2 * size_t{kStages} * kBN * D;
  static constexpr size_t kMergeBytes =
      sizeof(float) * kNW * (size_t{kRows} * kLd + 2 * kRows) + sizeof(float) * (kNW + 2) * kRows;
  static constexpr size_t kSmem = kQBytes + (kKvBytes > kMergeBytes ? kKvBytes : kMergeBytes);
};

// Shared memory of the paged decode past a configuration's `smem` bytes: two tiles' (page, row)
// entries, one per key row, from the next 16-byte boundary.
constexpr size_t decode_page_ring_at(size_t smem) {
  return (smem + 15) / 16 * 16;
}
constexpr size_t decode_paged_smem(size_t smem) {
  return decode_page_ring_at(smem) + 2 * 64 * sizeof(PageRow);
}

// Columns [col, col + 4) of a merged row: Y = acc / wsum (zeros where no split saw a key), and
// with column 0 the row's LSE = mx + log(wsum) (-inf there); row q of head h of sequence b.
template <class T>
__device__ __forceinline__ void store_merged_cols(const Params& p, int b, int h, int q, int col,
                                                  float4 acc, float wsum, float mx) {
  T* y = static_cast<T*>(p.out) + detail::row_offset(p.sy, p.varlen, b, h, q);
  const float inv = wsum > 0 ? 1.f / wsum : 0.f;
  *reinterpret_cast<uint2*>(y + col) =
      make_uint2(pack2<T>(acc.x * inv, acc.y * inv), pack2<T>(acc.z * inv, acc.w * inv));
  if (col == 0)
    static_cast<float*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, q)] =
        wsum > 0 ? mx + logf(wsum) : -INFINITY;
}

// The fused decode's merge of a group's split partials, by the block cuda::GroupMergeFlags picks:
// a thread per (row, 4 columns), the LSEs and partials of 8 splits loaded together (a round trip to
// L2 per 8 splits; 16 held 231-250 registers, two d64 CTAs an SM instead of three), merged in split
// order with a running max (the same bits whichever block merges).
template <class T>
__device__ void merge_group_splits(const Params& p, int b, int h_base, const SeqRows& s,
                                   int rows_total) {
  constexpr int kChunk = 8;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  const int dv = p.dim_v, c4 = dv / 4;  // dv is a multiple of 8 (fits)
  for (int idx = threadIdx.x; idx < rows_total * c4; idx += blockDim.x) {
    const int r = idx / c4, col = (idx % c4) * 4;
    const int h = h_base + r / s.lq, i = r % s.lq;
    const int64_t row = (int64_t{b} * p.heads_q + h) * p.len_q + i;
    float m = -INFINITY, wsum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < p.splits; s0 += kChunk) {
      float lse[kChunk];
      float4 x[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const int64_t sp = s0 + j;
        const bool in = sp < p.splits;
        lse[j] = in ? __ldcg(p.lse_part + sp * rows + row) : -INFINITY;
        x[j] = in ? __ldcg(reinterpret_cast<const float4*>(p.o_part + (sp * rows + row) * dv + col))
                  : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float cm = m;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) cm = fmaxf(cm, lse[j]);
      if (cm == -INFINITY) continue;       // no split so far saw a key
      const float rescale = expf(m - cm);  // 0 while m is -inf
      acc.x *= rescale, acc.y *= rescale, acc.z *= rescale, acc.w *= rescale;
      wsum *= rescale;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float w = expf(lse[j] - cm);  // 0 for a split that saw no key
        acc.x += w * x[j].x, acc.y += w * x[j].y, acc.z += w * x[j].z, acc.w += w * x[j].w;
        wsum += w;
      }
      m = cm;
    }
    store_merged_cols<T>(p, b, h, s.q0 + i, col, acc, wsum, m);
  }
}

// The fused decode's merge flags of one (batch, K/V head): 2 splits + 1 words in the workspace.
__device__ __forceinline__ cuda::GroupMergeFlags decode_merge_flags(const Params& p, int b,
                                                                    int hk) {
  return {p.split_flags + (int64_t{b} * p.heads_kv + hk) * cuda::GroupMergeFlags::words(p.splits),
          p.splits};
}

// kCounts: the launch has seqused_k counts (p.used_k; see seq_rows for why a template parameter).
// kPaged: K / V are paged pools (p.block_table), the counts read where the launch has them.
template <class T, int D, int MT, bool kFused = false, bool kCounts = false, bool kPaged = false>
__global__ void __launch_bounds__(128) flash_decode(Params p) {
  using Cfg = DecodeCfg<T, D, MT>;
  constexpr int kNT = Cfg::kThreads, kBN = Cfg::kBN, kRows = Cfg::kRows, kStages = Cfg::kStages;
  constexpr int kNW = Cfg::kNW, kLd = Cfg::kLd;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kRows * D;
  T* sV = sK + kStages * kBN * D;
  // Paged: the (page, row) entries of the next tiles to load, beyond the ring and merge buffers.
  [[maybe_unused]] PageRow* sPg =
      reinterpret_cast<PageRow*>(smem_raw + decode_page_ring_at(Cfg::kSmem));

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent launch: the CTAs may be resident before the previous
  // kernel on the stream has finished (it may write Q, K / V, cu_seqlens or read this launch's
  // outputs), so nothing global is touched before its grid has completed and flushed. H200, bench
  // shape, 200 runs back to back: 39.4 us a run launched normally, 38.4 as a dependent (same call).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // Lets the combine grid (launched the same way) get resident now and wait in its
  // griddepcontrol.wait, instead of paying its launch after the last CTA here retires.
  if constexpr (!kFused) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  trace_stamp(p, blockIdx.x, 0);
  int lin = blockIdx.x;
  const int hk = lin % p.heads_kv;
  lin /= p.heads_kv;
  // The fused kernel orders its CTAs split-major: where the device cannot hold the grid at once,
  // every group's split 0 starts first and may find later splits not started, the merge's
  // hand-off (ForwardPagedKv's four-wave batch is there to drive it; which path each group took
  // is not recorded). One sequence: the same order either way.
  const int split = kFused ? lin / p.batch : lin % p.splits;
  const int b = kFused ? lin % p.batch : lin / p.splits;
  const SeqRows s = seq_rows<(kCounts || kPaged)>(p, b);
  const int rows_total = p.group * s.lq;  // <= kRows (the kernel's fits predicate)
  if (rows_total == 0) return;            // flash_decode_combine skips these rows as well
  const int h_base = hk * p.group;
  if constexpr (kFused) {  // the merge's "started" mark (cuda::GroupMergeFlags)
    if (p.splits > 1 && split != 0 && threadIdx.x == 0)
      decode_merge_flags(p, b, hk).mark_started(split, p.tag);
  }

  // Keys any row sees: the band is monotone in the query index, so the first row's lo and the
  // last row's hi bound the union. The splits share that range, so masked-off prefixes (windows)
  // cost no CTA time.
  int64_t lo0, hi0, lo1, hi1;
  detail::visible_keys(p.band, 0, s.lq, s.lk, &lo0, &hi0);
  detail::visible_keys(p.band, s.lq - 1, s.lq, s.lk, &lo1, &hi1);
  const int key_end = static_cast<int>(max(hi1, lo0));
  const int vt_begin = static_cast<int>(lo0 / kBN), vt_end = (key_end + kBN - 1) / kBN;
  const int per = (vt_end - vt_begin + p.splits - 1) / p.splits;
  const int t_begin = min(vt_end, vt_begin + split * per);
  const int t_end = min(vt_end, t_begin + per);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  // K / V rows of the sequence's head (paged: the pools' head, rows found through the pages).
  const T* gk = static_cast<const T*>(p.k) +
                (kPaged ? hk * p.sk[1] : detail::row_offset(p.sk, p.varlen, b, hk, s.k0));
  const T* gv = static_cast<const T*>(p.v) +
                (kPaged ? hk * p.sv[1] : detail::row_offset(p.sv, p.varlen, b, hk, s.k0));
  const int64_t k_rs = p.varlen ? p.sk[0] : p.sk[2];
  const int64_t v_rs = p.varlen ? p.sv[0] : p.sv[2];
  // Paged: the sequence's block-table row. Where the page size is not windowed (below),
  // `next_pg` is this thread's (page, row) entry (threads below kBN, one key row each) of the
  // tile the next iteration loads, looked up an iteration ahead and stored to sPg at that
  // iteration's top. H200, b16 ragged batch, thirty-seventh session: 16-key pages 134.7 us looked
  // up at issue (call 6), 64.7 this way (call 7) (docs/perf/attention.md).
  [[maybe_unused]] const int32_t* pages_row =
      kPaged ? p.block_table + int64_t{b} * p.table_cols : nullptr;
  [[maybe_unused]] PageRow next_pg{0, 0};
  // Paged, page sizes a PageWindow serves: the table entries stream through registers; other
  // sizes keep the shared-memory ring.
  [[maybe_unused]] bool windowed = false;
  [[maybe_unused]] PageWindow win;
  if constexpr (kPaged) {
    windowed = detail::page_window_serves(p.page_size, kBN);
    if (windowed && t_begin < t_end) win.init(p, pages_row, t_begin * kBN);
  }

  // Q rows r = (query head h_base + r / Lq, query r % Lq); padding rows are zero.
  for (int c = threadIdx.x; c < kRows * D / 8; c += kNT) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    const bool ok = r < rows_total && col < p.dim_qk;
    const T* src = static_cast<const T*>(p.q);
    if (ok) src += detail::row_offset(p.sq, p.varlen, b, h_base + r / s.lq, s.q0 + r % s.lq) + col;
    cp_async16(smem_u32(sQ + swz<D>(r, col)), src, ok ? 16 : 0);
  }
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (t_begin + st < t_end) {
      if constexpr (kPaged) {  // the ring's first tiles look their pages up directly
        const int r0 = (t_begin + st) * kBN;
        if (windowed)
          win.load_tile<T, kBN, D, kNT>(sK + st * kBN * D, sV + st * kBN * D, gk, gv, p, pages_row,
                                        t_begin + st, s.lk);
        else
          load_kv_paged<T, kBN, D, kNT>(
              sK + st * kBN * D, sV + st * kBN * D, gk, gv, p, r0, s.lk,
              [&](int r) { return page_row(p, pages_row, r0 + r, s.lk); });
      } else {
        load_tile<T, kBN, D, kNT>(sK + st * kBN * D, gk, k_rs, (t_begin + st) * kBN, s.lk,
                                  p.dim_qk);
        load_tile<T, kBN, D, kNT>(sV + st * kBN * D, gv, v_rs, (t_begin + st) * kBN, s.lk, p.dim_v);
      }
    }
    cp_async_commit();
  }
  if constexpr (kPaged) {
    const int tn = t_begin + kStages - 1;
    if (tn < t_end && !windowed && threadIdx.x < kBN)
      next_pg = page_row(p, pages_row, tn * kBN + static_cast<int>(threadIdx.x), s.lk);
  }

  // This thread's fragment rows (mt, hf) -> mt * 16 + hf * 8 + g and their visible keys; padding
  // rows see nothing.
  int lo_r[MT][2], hi_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + hf * 8 + g;
      int64_t lo = 0, hi = 0;
      if (r < rows_total) detail::visible_keys(p.band, r % s.lq, s.lq, s.lk, &lo, &hi);
      lo_r[mt][hf] = static_cast<int>(lo), hi_r[mt][hf] = static_cast<int>(hi);
    }

  constexpr int kKSteps = D / 16, kOTiles = D / 8;
  float o[MT][kOTiles][4];
  float m_r[MT][2], l_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) o[mt][t][0] = o[mt][t][1] = o[mt][t][2] = o[mt][t][3] = 0.f;
    m_r[mt][0] = m_r[mt][1] = -INFINITY;
    l_r[mt][0] = l_r[mt][1] = 0.f;
  }
  const float log2e = 1.4426950408889634f;
  const float sl2 = p.scale * log2e;
  const bool capped = p.softcap > 0;

  for (int t = t_begin; t < t_end; ++t) {
    if constexpr (kPaged) {  // the entries of this iteration's tile to load (two-slot ring)
      if (!windowed && threadIdx.x < kBN)
        sPg[((t + kStages - 1) & 1) * kBN + threadIdx.x] = next_pg;
    }
    cp_async_wait<kStages - 2>();  // tile t has landed for this thread ...
    __syncthreads();               // ... and for all; everyone is done with tile t - 1's stage
    {
      const int tn = t + kStages - 1, sn = (tn - t_begin) % kStages;
      if (tn < t_end) {
        if constexpr (kPaged) {
          if (windowed) {
            win.load_tile<T, kBN, D, kNT>(sK + sn * kBN * D, sV + sn * kBN * D, gk, gv, p,
                                          pages_row, tn, s.lk);
          } else {
            const PageRow* slot = sPg + (tn & 1) * kBN;
            load_kv_paged<T, kBN, D, kNT>(sK + sn * kBN * D, sV + sn * kBN * D, gk, gv, p, tn * kBN,
                                          s.lk, [&](int r) { return slot[r]; });
            if (tn + 1 < t_end && threadIdx.x < kBN)
              next_pg =
                  page_row(p, pages_row, (tn + 1) * kBN + static_cast<int>(threadIdx.x), s.lk);
          }
        } else {
          load_tile<T, kBN, D, kNT>(sK + sn * kBN * D, gk, k_rs, tn * kBN, s.lk, p.dim_qk);
          load_tile<T, kBN, D, kNT>(sV + sn * kBN * D, gv, v_rs, tn * kBN, s.lk, p.dim_v);
        }
      }
      cp_async_commit();
    }
    const int stage = (t - t_begin) % kStages;
    const T* tK = sK + stage * kBN * D;
    const T* tV = sV + stage * kBN * D;
    const int kw = warp * 16;                       // this warp's keys within the tile
    const int n0 = t * kBN + kw;                    // ... as key indices
    if (n0 >= key_end || n0 + 16 <= lo0) continue;  // no row sees them (tail, window prefix)
    float sc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      const int mi = lane / 8;
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(smem_u32(tK + swz<D>(kw + (lane % 8) + (mi / 2) * 8, ks * 16 + (mi % 2) * 8)), b0,
                  b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t a[4];
        ldmatrix_x4(smem_u32(sQ + swz<D>(mt * 16 + (lane % 16), ks * 16 + (lane / 16) * 8)), a[0],
                    a[1], a[2], a[3]);
        mma16816<T>(sc[mt][0], a, b0, b1);
        mma16816<T>(sc[mt][1], a, b2, b3);
      }
    }
    // Every real row sees all 16 keys: skip the per-element mask.
    const bool full = n0 >= lo1 && n0 + 16 <= hi0;
    uint32_t pf[MT][2][2];
    prep_scores(sc, p, sl2, n0, tq, lo_r, hi_r, capped, !full);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx0 = m_r[mt][0], mx1 = m_r[mt][1];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        mx0 = fmaxf(mx0, fmaxf(sc[mt][n][0], sc[mt][n][1]));
        mx1 = fmaxf(mx1, fmaxf(sc[mt][n][2], sc[mt][n][3]));
      }
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
      }
      // A row that has seen only masked keys keeps max -inf: base 0 makes every exp2 exactly 0.
      const float base0 = mx0 == -INFINITY ? 0.f : mx0;
      const float base1 = mx1 == -INFINITY ? 0.f : mx1;
      const float corr0 = exp2_ftz(m_r[mt][0] - base0), corr1 = exp2_ftz(m_r[mt][1] - base1);
      m_r[mt][0] = mx0, m_r[mt][1] = mx1;
      l_r[mt][0] *= corr0, l_r[mt][1] *= corr1;
#pragma unroll
      for (int d = 0; d < kOTiles; ++d) {
        o[mt][d][0] *= corr0, o[mt][d][1] *= corr0, o[mt][d][2] *= corr1, o[mt][d][3] *= corr1;
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float p0 = exp2_ftz(sc[mt][n][0] - base0), p1 = exp2_ftz(sc[mt][n][1] - base0);
        const float p2 = exp2_ftz(sc[mt][n][2] - base1), p3 = exp2_ftz(sc[mt][n][3] - base1);
        l_r[mt][0] += p0 + p1;
        l_r[mt][1] += p2 + p3;
        pf[mt][n][0] = pack2<T>(p0, p1);
        pf[mt][n][1] = pack2<T>(p2, p3);
      }
    }
#pragma unroll
    for (int d = 0; d < kOTiles; d += 2) {
      const int mi = lane / 8;
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4_trans(smem_u32(tV + swz<D>(kw + (lane % 8) + (mi % 2) * 8, d * 8 + (mi / 2) * 8)),
                        b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint32_t a[4] = {pf[mt][0][0], pf[mt][0][1], pf[mt][1][0], pf[mt][1][1]};
        mma16816<T>(o[mt][d], a, b0, b1);
        mma16816<T>(o[mt][d + 1], a, b2, b3);
      }
    }
  }
  // Split 0 of the fused kernel loads its group's started marks now, so that the warps' merge and
  // the partial stores below hide their round trip (read after them, it was on the merge's path).
  // H200, ninety-fourth session, two calls, default plan a run: b1 64-key pages 40.61-40.86 us
  // against 40.99-41.22, b6 Lk 4096 32.80-32.99 against 33.25-33.34, b1 Lk 32k 39.30-40.00
  // against 39.42-39.97 (docs/perf/attention.md).
  [[maybe_unused]] unsigned long long early_mark = 0;
  if constexpr (kFused) {
    if (p.splits > 1 && split == 0 && warp == 0)
      early_mark = decode_merge_flags(p, b, hk).early_started_mark(p.tag);
  }
  cp_async_wait<0>();
  trace_stamp(p, blockIdx.x, 1);
  __syncthreads();  // the K/V ring becomes the merge buffer

  // Merge the four warps' states: sO[w][row][col] (unnormalized, relative to sM[w][row] in the
  // exp2 domain), then per-row weights sW[w][row], 1 / l and the LSE.
  float* sO = reinterpret_cast<float*>(sK);
  float* sM = sO + kNW * kRows * kLd;
  float* sL = sM + kNW * kRows;
  float* sW = sL + kNW * kRows;
  float* sInv = sW + kNW * kRows;
  float* sLse = sInv + kRows;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + hf * 8 + g;
      float l = l_r[mt][hf];
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 <<= 1) l += __shfl_xor_sync(0xffffffffu, l, o2);
      float* dst = sO + (warp * kRows + r) * kLd;
#pragma unroll
      for (int d = 0; d < kOTiles; ++d)
        *reinterpret_cast<float2*>(dst + d * 8 + 2 * tq) =
            make_float2(o[mt][d][hf * 2], o[mt][d][hf * 2 + 1]);
      if (tq == 0) sM[warp * kRows + r] = m_r[mt][hf], sL[warp * kRows + r] = l;
    }
  __syncthreads();
  const float ln2 = 0.6931471805599453f;
  if (threadIdx.x < rows_total) {
    const int r = threadIdx.x;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNW; ++w) mx = fmaxf(mx, sM[w * kRows + r]);
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kNW; ++w) {
      const float mw = sM[w * kRows + r];
      // A warp that saw no visible key has l = 0 and O = 0: weight 0 (also avoids inf - inf).
      const float wgt = mw == -INFINITY ? 0.f : exp2f(mw - mx);
      sW[w * kRows + r] = wgt;
      l += wgt * sL[w * kRows + r];
    }
    sInv[r] = l > 0 ? 1.f / l : 0.f;
    sLse[r] = l > 0 ? (mx + log2f(l)) * ln2 : -INFINITY;
  }
  __syncthreads();
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  const int dv = p.dim_v;  // a multiple of 8 (fits)
  for (int idx = threadIdx.x; idx < rows_total * (dv / 2); idx += kNT) {
    const int r = idx / (dv / 2), col = (idx % (dv / 2)) * 2;
    float v0 = 0.f, v1 = 0.f;
#pragma unroll
    for (int w = 0; w < kNW; ++w) {
      const float wgt = sW[w * kRows + r];
      const float2 x = *reinterpret_cast<const float2*>(sO + (w * kRows + r) * kLd + col);
      v0 += wgt * x.x, v1 += wgt * x.y;
    }
    v0 *= sInv[r], v1 *= sInv[r];
    const int h = h_base + r / s.lq, i = r % s.lq;
    if (p.splits > 1) {  // normalized f32 partial + LSE, merged by flash_decode_combine
      const int64_t ridx = split * rows + (int64_t{b} * p.heads_q + h) * p.len_q + i;
      *reinterpret_cast<float2*>(p.o_part + ridx * dv + col) = make_float2(v0, v1);
      if (col == 0) p.lse_part[ridx] = sLse[r];
    } else {
      T* dst = static_cast<T*>(p.out) + detail::row_offset(p.sy, p.varlen, b, h, s.q0 + i);
      *reinterpret_cast<uint32_t*>(dst + col) = pack2<T>(v0, v1);
      if (col == 0)
        static_cast<float*>(p.lse)[detail::lse_offset(p.sl, p.varlen, b, h, s.q0 + i)] = sLse[r];
    }
  }
  trace_stamp(p, blockIdx.x, 2);
  if constexpr (kFused) {
    if (p.splits > 1) {
      // In-kernel merge (flash_decode_fused_sm80): no second launch. Split 0 of each (batch, K/V
      // head) merges where it finds every other split of its group started (so running: waiting
      // for them cannot deadlock), after their "done" flags; the others raise "done" and leave.
      // Where some split has not started yet, split 0 hands the merge off and whichever block
      // finishes last merges (cuda::GroupMergeFlags). Flags hold this launch's tag (nothing to
      // initialize) and the merging block clears them (a replayed CUDA graph reuses the tag). Sums
      // in split order: the same bits whichever block merges.
      const cuda::GroupMergeFlags flags = decode_merge_flags(p, b, hk);
      const bool merges = flags.merges_here(split, p.tag, reinterpret_cast<int*>(sQ), early_mark);
      trace_stamp(p, blockIdx.x, 3);
      if (!merges) return;
      merge_group_splits<T>(p, b, h_base, s, rows_total);
      flags.clear();
      trace_stamp(p, blockIdx.x, 4);
    }
  }
}

// A merge kernel's first step. Launched early (programmatic dependent launch): wait for the split
// kernel to complete and its partials to be visible; a no-op when launched normally. The next
// kernel on the stream may get resident meanwhile (it waits for this grid in its own
// griddepcontrol.wait, if it was launched as a dependent at all).
__device__ __forceinline__ void await_split_partials() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// Merged row `row` of the [B, Hq, Lq] rows: its sequence, query head and query.
struct MergedRow {
  int b, h, i;
};
__device__ __forceinline__ MergedRow merged_row(const Params& p, int64_t row) {
  const int i = static_cast<int>(row % p.len_q);
  const int h = static_cast<int>((row / p.len_q) % p.heads_q);
  return {static_cast<int>(row / (int64_t{p.len_q} * p.heads_q)), h, i};
}
// The largest of a row's split LSEs, in every lane of the warp (lanes own splits, then a fixed
// shuffle tree).
__device__ __forceinline__ float split_lse_max(const Params& p, int64_t rows, int64_t row,
                                               int lane) {
  float mx = -INFINITY;
  for (int sp = lane; sp < p.splits; sp += 32) mx = fmaxf(mx, p.lse_part[sp * rows + row]);
#pragma unroll
  for (int o2 = 16; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
  return mx;
}
// acc += w * one split's partial row, the lane's float4 columns 4 lane and 128 + 4 lane of dv.
__device__ __forceinline__ void add_split_row(float4 (&acc)[2], float w, const float* src, int lane,
                                              int dv) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int c = 4 * lane + 128 * u;
    if (c < dv) {
      const float4 x = *reinterpret_cast<const float4*>(src + c);
      acc[u].x += w * x.x, acc[u].y += w * x.y, acc[u].z += w * x.z, acc[u].w += w * x.w;
    }
  }
}
// A merged row out: Y = acc / wsum (zeros where no split saw a key), LSE = mx + log(wsum) (-inf
// there) from lane 0; row q of head h of sequence b.
template <class T>
__device__ __forceinline__ void store_merged_row(const Params& p, int b, int h, int q, int lane,
                                                 int dv, const float4 (&acc)[2], float wsum,
                                                 float mx) {
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int c = 4 * lane + 128 * u;
    if (c < dv) store_merged_cols<T>(p, b, h, q, c, acc[u], wsum, mx);
  }
}

// Merges the splits of each row (one CTA of four warps per row): y = sum_s w_s o_s / sum_s w_s
// with w_s = exp(lse_s - max), lse = max + log(sum_s w_s). Latency, not bandwidth, bounds it (a
// few hundred KB in total, 32 rows for the bench shape), so the loads of every split are issued
// at once: lanes own splits for the max and the weight sum, and warp w reads the float4 partial
// rows of splits w, w + 4, ... (8 apiece for 32 splits, where one warp per row needed four round
// trips). The first 8 of a warp's rows are loaded before the LSE max, in the same round trip
// (H100, Lk 32k decode: 55.97 -> 54.6 us for decode + combine, da06694). Sums run in split order
// per warp, then over the warps in order, and in a fixed shuffle tree for the weights:
// deterministic.
template <class T>
__global__ void __launch_bounds__(128) flash_decode_combine(Params p) {
  await_split_partials();
  trace_stamp(p, decode_trace_ctas(p) + static_cast<int>(blockIdx.x), 0);
  constexpr int kNW = 4;
  __shared__ float4 s_acc[kNW][2][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;  // uniform per CTA: the early returns below skip no barrier
  const auto [b, h, i] = merged_row(p, row);
  if (b >= p.batch) return;
  const SeqRows s = seq_rows(p, b);
  if (i >= s.lq) return;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  // Every split writes each of its rows (LSE -inf where it saw no key), so all take part. Each
  // warp computes the max and the weight sum itself (same order, same bits) instead of a barrier.
  // The partial rows of the warp's first kEarly splits are loaded before the LSE max is known
  // (their addresses do not depend on it), so both loads share one round trip.
  constexpr int kEarly = 8;
  const int dv = p.dim_v;  // a multiple of 8 (the decode kernel's fits)
  float4 early[kEarly][2];
#pragma unroll
  for (int e = 0; e < kEarly; ++e) {
    const int sp = warp + kNW * e;
    const float* src = p.o_part + (sp * rows + row) * dv;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int c = 4 * lane + 128 * u;
      early[e][u] = sp < p.splits && c < dv ? *reinterpret_cast<const float4*>(src + c)
                                            : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  const float mx = split_lse_max(p, rows, row, lane);
  float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  float wsum = 0.f;
  // Splits in increasing order per warp: the early ones from registers, then the rest.
  if (mx > -INFINITY) {
    for (int sp = lane; sp < p.splits; sp += 32) wsum += expf(p.lse_part[sp * rows + row] - mx);
#pragma unroll
    for (int e = 0; e < kEarly; ++e) {
      const int sp = warp + kNW * e;
      if (sp >= p.splits) break;
      const float w = expf(p.lse_part[sp * rows + row] - mx);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const float4 x = early[e][u];
        acc[u].x += w * x.x, acc[u].y += w * x.y, acc[u].z += w * x.z, acc[u].w += w * x.w;
      }
    }
#pragma unroll 8
    for (int sp = warp + kNW * kEarly; sp < p.splits; sp += kNW) {
      const float w = expf(p.lse_part[sp * rows + row] - mx);
      add_split_row(acc, w, p.o_part + (sp * rows + row) * dv, lane, dv);
    }
  }
#pragma unroll
  for (int o2 = 16; o2 > 0; o2 >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o2);
  s_acc[warp][0][lane] = acc[0];
  s_acc[warp][1][lane] = acc[1];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 1; w < kNW; ++w)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float4 x = s_acc[w][u][lane];
      acc[u].x += x.x, acc[u].y += x.y, acc[u].z += x.z, acc[u].w += x.w;
    }
  store_merged_row<T>(p, b, h, s.q0 + i, lane, dv, acc, wsum, mx);
  trace_stamp(p, decode_trace_ctas(p) + static_cast<int>(blockIdx.x), 1);
}

// The split merge for many rows of few splits (fa3's packed chunks: thousands of rows, at most 16
// splits): a warp a row, 8 rows a block. flash_decode_combine spreads one row's splits over a
// block's 4 warps, which suits decode's tens of rows of up to 128 splits; on 4096 rows of 4 splits
// it took 17.6 us next to the attention kernel's 25.6 (H200, ncu, 2026-11-30). Each lane keeps the
// weight sum itself, adding the splits in order as the accumulators do: deterministic.
template <class T>
__global__ void __launch_bounds__(256) flash_rows_combine(Params p) {
  await_split_partials();
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  const int64_t row = int64_t{blockIdx.x} * 8 + threadIdx.x / 32;  // uniform per warp
  if (row >= rows) return;
  const auto [b, h, i] = merged_row(p, row);
  const SeqRows s = seq_rows(p, b);
  if (i >= s.lq) return;
  const int dv = p.dim_v;  // a multiple of 8, at most 256
  const float mx = split_lse_max(p, rows, row, lane);
  float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  float wsum = 0.f;
  if (mx > -INFINITY) {
#pragma unroll 4
    for (int sp = 0; sp < p.splits; ++sp) {
      const float w = expf(p.lse_part[sp * rows + row] - mx);
      wsum += w;
      add_split_row(acc, w, p.o_part + (sp * rows + row) * dv, lane, dv);
    }
  }
  store_merged_row<T>(p, b, h, s.q0 + i, lane, dv, acc, wsum, mx);
}

// ---- host side ----------------------------------------------------------------------------------
constexpr int kDecodeMaxLq = 16;

inline int decode_rows(const Problem& pr) {
  return static_cast<int>(pr.group * pr.desc.len_q);
}
inline int decode_dim(const Problem& pr) {
  const int64_t d = std::max(pr.desc.head_dim_qk, pr.desc.head_dim_v);
  return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

template <int D, int MT>
constexpr size_t decode_smem() {
  return DecodeCfg<__nv_bfloat16, D, MT>::kSmem;  // f16 and bf16 are the same size
}
inline size_t decode_smem_of(const Problem& pr) {
  const bool two = decode_rows(pr) > 16;
  size_t smem;
  switch (decode_dim(pr)) {
    case 64:
      smem = two ? decode_smem<64, 2>() : decode_smem<64, 1>();
      break;
    case 128:
      smem = two ? decode_smem<128, 2>() : decode_smem<128, 1>();
      break;
    default:
      smem = decode_smem<256, 1>();
  }
  return pr.desc.page_size > 0 ? decode_paged_smem(smem) : smem;
}

// Rows of the group fit one or two m16 tiles (two only up to D = 128, to stay in registers), and
// the device grants the shared memory (at D = 128, 100-104 KB: more than an sm_86 / sm_89 block's
// 99 KB).
inline bool decode_fits(const Problem& pr, const DeviceCaps& caps) {
  const Descriptor& d = pr.desc;
  if (d.head_dim_qk % 8 != 0 || d.head_dim_v % 8 != 0) return false;
  if (d.len_q > kDecodeMaxLq || pr.group * d.len_q > 32) return false;
  if (pr.group * d.len_q > 16 && decode_dim(pr) > 128) return false;
  return static_cast<int64_t>(decode_smem_of(pr)) <= caps.smem_per_block_optin;
}

// Decode CTAs one SM holds by shared memory (1 to 4): the opt-in block limit plus the 1 KB the
// driver reserves per block, over a CTA's bytes plus that 1 KB.
inline int64_t decode_blocks_per_sm(const Problem& pr, const DeviceCaps& caps) {
  return std::clamp<int64_t>(
      (caps.smem_per_block_optin + 1024) / static_cast<int64_t>(decode_smem_of(pr) + 1024), 1, 4);
}

// Splits: kWaves CTAs per SM, each with at least kMinTiles tiles so the partial write and the
// pipeline fill stay small next to its stream.
// One CTA per SM, although shared memory holds two or three: fewer, longer streams read faster.
// H200, bf16, Lk 32k, 8 K/V heads, one event pair a run (back to back), A/B entries in one call
// (docs/perf/attention.md, thirty-fifth session): d128 16 splits of 32 tiles on 128 SMs
// 39.97-40.13 us (38.06-38.23) against 32 splits of 16 tiles two to an SM 40.96-41.31 us
// (39.40-39.49); Lq 4 causal 41.70-42.21 (40.08-40.18) against 42.69-43.39 (41.25-41.43); d64
// (three to an SM before) 26.02-26.14 (24.15-24.22) against 27.65-28.29 (26.64-26.88). Not the
// in-flight bytes alone: a ring one stage deeper (96 KB in flight an SM instead of 64) read
// 40.19-40.70 us (38.21-38.29), one stage shallower (32 KB) 45.95-46.02 us.
// Where one CTA per SM would leave more than an eighth of the SMs idle (e.g. 96 batch x K/V head
// pairs: one split each on 96 of 132 SMs) the rule depends on the head dim. At d64 the splits
// fill what shared memory holds (three CTAs an SM): a lone d64 CTA, streaming 16 KB tile pairs,
// reads too slowly to leave SMs idle (H200, 12 x 8 K/V heads, Lk 4096, thirty-sixth session:
// three an SM, 4 splits, 32.8-33.3 us against one an SM with an 8-stage ring, 1 split, 38.1). At
// d128 and d256 the one-per-SM count stays, even a single split: no partials and no combine
// launch weigh more than the idle SMs (12 x 8 heads, Lk 2048: 1 split 30.5-30.9 us against 2
// splits two an SM 34.7-35.0; 6 x 8 heads, Lk 4096: 2 splits 33.5-34.1 against 5 splits
// 34.1-34.2).
// kWaves = 1 (flash_decode_sm80): one wave, every split starts at once, but a CTA that starts or
// streams late finishes late and nothing fills its slot. kWaves = 4 (flash_decode_w4_sm80): 4x
// shorter splits that the block scheduler hands to SMs as they free up, so SMs finish together,
// at the price of 4x the partials, 4x the CTA prologues and a longer combine. Which wins is a
// measurement (bench A/B rows).
// Paged caches may take more waves than the kernel's (detail::decode_waves).
// kMinTiles = 2 (flash_decode_fused_sm80): short caches get up to twice the splits (Lk 2048:
// 16 splits of 2 tiles against 8 of 4). Caches of 4096 keys and more get the same splits either
// way (8 K/V heads on 132 SMs: 16).
template <int kWaves = 1, int kMinTiles = 4>
inline int decode_splits(const Problem& pr, const DeviceCaps& caps) {
  const Descriptor& d = pr.desc;
  const int64_t tiles = cuda::ceil_div(d.len_k, int64_t{DecodeCfg<__nv_bfloat16, 64, 1>::kBN});
  const int64_t per_sm = decode_blocks_per_sm(pr, caps);
  const int64_t groups = d.batch * d.heads_kv, sms = caps.sm_count;
  return detail::decode_split_count(
      groups, tiles, sms * detail::decode_waves(kWaves, d.page_size > 0, groups, sms),
      decode_dim(pr) == 64, per_sm, kMinTiles);
}
// The workspace of a run with `splits` splits: f32 partial rows and their LSEs per split and row,
// then for the fused variant 2 splits + 1 8-byte flag words per (batch, K/V head)
// (cuda::GroupMergeFlags) from the first 8-byte boundary after them. One place for the layout the
// plan sizes and the launch addresses.
struct DecodeWorkspace {
  size_t flags_offset = 0, bytes = 0;
};
template <bool kFused>
DecodeWorkspace decode_workspace_layout(const Problem& pr, int splits) {
  if (splits <= 1) return {};
  const Descriptor& d = pr.desc;
  const int64_t rows = d.batch * d.heads_q * d.len_q;
  const auto part = static_cast<size_t>(splits * rows * (d.head_dim_v + 1)) * sizeof(float);
  if (!kFused) return {part, part};
  const size_t flags = (part + 7) / 8 * 8;
  return {flags, flags + sizeof(unsigned long long) *
                             static_cast<size_t>(d.batch * d.heads_kv *
                                                 cuda::GroupMergeFlags::words(splits))};
}
template <bool kFused>
constexpr int decode_min_tiles() {
  return kFused ? 2 : 4;
}
template <int kWaves = 1, bool kFused = false>
size_t decode_workspace(const Problem& pr, const DeviceCaps& caps) {
  return decode_workspace_layout<kFused>(
             pr, decode_splits<kWaves, decode_min_tiles<kFused>()>(pr, caps))
      .bytes;
}

// Where flash_decode_fused_sm80 is the default (ranked above flash_decode_sm80): groups of at most
// 4 query rows (one a thread in its merge) split more than once, the grid within what the device
// holds at once (split 0 then finds its group started and merges without the hand-off). H200,
// ninety-third session (32cfb7c, three processes, us a run / 200 back to back): b1 Lk 32k d128
// 39.7-40.0 / 36.8 against the two launches' 39.7-40.2 / 38.0; d64 26.1-26.2 / 23.2 against
// 25.5-26.0 / 24.1; b1 Lk 4096 11.5 / 9.0 against 12.5-14.0 / 10.5-11.5; b6 Lk 4096 32.9-33.2 /
// 30.2 against 33.5-34.1 / 31.8; b12 Lk 4096 d64 32.2-32.5 / 29.3 against 32.7-33.6 / 31.6; b1
// 64-key pages 40.7-41.1 / 38.0 against 41.9-42.1 / 40.1. Not beyond: 16 rows (Lq 4 in groups of
// 4) 44.6 against 41.9 us a run; a paged batch in four waves (the hand-off) 36.6-37.3 against
// 33.7-34.4. Measured on sm_90 only (where both decode paths are programmatic dependent
// launches); other parts keep flash_decode_sm80.
inline bool decode_fused_leads(const Problem& pr, const DeviceCaps& caps) {
  if (caps.sm < 90 || !decode_fits(pr, caps) || decode_rows(pr) > 4) return false;
  const int64_t splits = decode_splits<1, decode_min_tiles<true>()>(pr, caps);
  return splits > 1 && pr.desc.batch * pr.desc.heads_kv * splits <=
                           int64_t{caps.sm_count} * decode_blocks_per_sm(pr, caps);
}

// A tag per fused decode launch (the value its split flags are raised to): launch n gets n
// scrambled by a fixed odd multiplier and xor (a bijection of 64-bit words, so no two launches of
// a process share a tag), which keeps tags away from the small integers and zeros that stale
// memory most often holds; never 0, the cleared value.
inline unsigned long long next_decode_tag() {
  static std::atomic<unsigned long long> launches{0};
  const unsigned long long n = launches.fetch_add(1, std::memory_order_relaxed) + 1;
  const unsigned long long tag = (n * 0x9e3779b97f4a7c15ull) ^ 0x5bd1e9955bd1e995ull;
  return tag != 0 ? tag : 0x5bd1e9955bd1e995ull;
}

// kFused (flash_decode_fused_sm80): the kernel that merges its splits where there is more than
// one; otherwise the split kernel.
template <class T, int D, int MT, bool kFused, bool kCounts, bool kPaged>
Status run_decode(const LaunchContext& ctx, const Params& p) {
  using Cfg = DecodeCfg<T, D, MT>;
  constexpr size_t kSmem = kPaged ? decode_paged_smem(Cfg::kSmem) : Cfg::kSmem;
  const auto blocks = static_cast<unsigned>(int64_t{p.batch} * p.heads_kv * p.splits);
  const bool fused = kFused && p.splits > 1;
  constexpr auto kernel = flash_decode<T, D, MT, false, kCounts, kPaged>;
  constexpr auto fused_kernel = flash_decode<T, D, MT, kFused, kCounts, kPaged>;
  return fused
             ? cuda::launch_dependent<fused_kernel>(ForwardOp::name, "flash_decode_fused",
                                                    dim3(blocks), dim3(Cfg::kThreads), kSmem,
                                                    cuda::stream_of(ctx), p)
             : cuda::launch_dependent<kernel>(ForwardOp::name, "flash_decode", dim3(blocks),
                                              dim3(Cfg::kThreads), kSmem, cuda::stream_of(ctx), p);
}

// Both decode launches are programmatic dependent launches where the binary has the
// griddepcontrol.wait (each kernel's first global access waits behind it).
template <class T>
Status launch_decode_combine(const LaunchContext& ctx, const Params& p, int64_t rows) {
  return cuda::launch_dependent<flash_decode_combine<T>>(ForwardOp::name, "flash_decode_combine",
                                                         dim3(static_cast<unsigned>(rows)),
                                                         dim3(128), 0, cuda::stream_of(ctx), p);
}

// flash_rows_combine over `rows` rows (8 a block), a programmatic dependent launch as above.
template <class T>
Status launch_rows_combine(const LaunchContext& ctx, const Params& p, int64_t rows) {
  return cuda::launch_dependent<flash_rows_combine<T>>(ForwardOp::name, "flash_rows_combine",
                                                       dim3(static_cast<unsigned>((rows + 7) / 8)),
                                                       dim3(256), 0, cuda::stream_of(ctx), p);
}

template <class T, int kWaves = 1, bool kFused = false>
Status launch_decode(const LaunchContext& ctx, const Problem& pr, const ForwardArguments& a) {
  // cp.async needs 16-byte aligned rows; otherwise the SIMT kernel runs (same contract).
  if (!rows_aligned(a.q, sizeof(T)) || !rows_aligned(a.k, sizeof(T)) ||
      !rows_aligned(a.v, sizeof(T)) || !rows_aligned(a.y, sizeof(T)))
    return launch_fwd_simt<T, float>(ctx, pr, a);
  Params p = fwd_params(pr, a);
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.len_q;
  if (rows == 0) return {};
  p.splits = decode_splits<kWaves, decode_min_tiles<kFused>()>(pr, ctx.stream.caps());
  if (p.splits > 1) {
    const DecodeWorkspace ws = decode_workspace_layout<kFused>(pr, p.splits);
    if (ctx.workspace.bytes < ws.bytes)
      return Error::workspace_too_small(std::string(ForwardOp::name) + ": decode split partials",
                                        ws.bytes, ctx.workspace.bytes);
    const SplitParts parts = split_parts(ctx.workspace.data, p.splits, rows, p.dim_v);
    p.o_part = parts.o, p.lse_part = parts.lse;
    if (kFused) {
      p.split_flags = reinterpret_cast<unsigned long long*>(
          static_cast<unsigned char*>(ctx.workspace.data) + ws.flags_offset);
      p.tag = next_decode_tag();
    }
  }
#if defined(BARACUDA_KERNEL_TRACE) && BARACUDA_KERNEL_TRACE
  p.trace = cuda::trace_for_launch();
#endif
  const bool two = decode_rows(pr) > 16;
  // The padded head dim and the m16 tiles of the group pick a launch shape (not a dtype dispatch),
  // seqused_k's counts and paged K / V the instance that reads them.
  const int dim = decode_dim(pr);
  auto run = [&](auto counts, auto paged) {
    constexpr bool kC = decltype(counts)::value, kP = decltype(paged)::value;
    return dim == 64    ? (two ? run_decode<T, 64, 2, kFused, kC, kP>(ctx, p)
                               : run_decode<T, 64, 1, kFused, kC, kP>(ctx, p))
           : dim == 128 ? (two ? run_decode<T, 128, 2, kFused, kC, kP>(ctx, p)
                               : run_decode<T, 128, 1, kFused, kC, kP>(ctx, p))
                        : run_decode<T, 256, 1, kFused, kC, kP>(ctx, p);
  };
  const Status st = p.block_table ? run(std::false_type{}, std::true_type{})
                    : p.used_k    ? run(std::true_type{}, std::false_type{})
                                  : run(std::false_type{}, std::false_type{});
  const bool combine = st.ok() && p.splits > 1 && !kFused;  // fused: merged in the kernel
  const Status done = combine ? launch_decode_combine<T>(ctx, p, rows) : st;
#if defined(BARACUDA_KERNEL_TRACE) && BARACUDA_KERNEL_TRACE
  const int ctas = decode_trace_ctas(p), combine_ctas = combine ? static_cast<int>(rows) : 0;
  cuda::dump_trace(cuda::stream_of(ctx), p.trace, ctas + combine_ctas, [&] {
    const char* kind = p.splits <= 1 ? "single" : kFused ? "fused" : kWaves == 4 ? "w4" : "split";
    return std::string("decode ") + kind + " batch " + std::to_string(p.batch) + " heads_q " +
           std::to_string(p.heads_q) + " heads_kv " + std::to_string(p.heads_kv) + " len_q " +
           std::to_string(p.len_q) + " len_k " + std::to_string(p.len_k) + " dim " +
           std::to_string(p.dim_v) + " splits " + std::to_string(p.splits) + " ctas " +
           std::to_string(ctas) + " combine " + std::to_string(combine_ctas);
  });
#endif
  return done;
}

}  // namespace baracuda::attention::kernels

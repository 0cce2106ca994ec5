// Pieces shared by the CPU reference and the CUDA kernels (host + device): which keys a query row
// sees, and where rows live in padded or packed (varlen) tensors.
#pragma once

#include <algorithm>
#include <cstdint>

#include "baracuda/ops/attention.hpp"

#if defined(__CUDACC__)
#define BARACUDA_ATTN_HD __host__ __device__ __forceinline__
#else
#define BARACUDA_ATTN_HD inline
#endif

namespace baracuda::attention::detail {

// The mask as plain integers, so kernels take it by value.
struct Band {
  int64_t left = -1, right = -1;
  bool bottom_right = false;
};
inline Band band_of(const Mask& m) {
  return {m.left, m.right, m.diagonal == Diagonal::bottom_right};
}

// Keys [*lo, *hi) visible to query row i of a sequence with lq queries and lk keys (empty when
// *lo >= *hi: a fully masked row).
BARACUDA_ATTN_HD void visible_keys(const Band& b, int64_t i, int64_t lq, int64_t lk, int64_t* lo,
                                   int64_t* hi) {
  const int64_t d = b.bottom_right ? i + lk - lq : i;
  int64_t l = 0, h = lk;
  if (b.left >= 0 && d - b.left > l) l = d - b.left;
  if (b.right >= 0 && d + b.right + 1 < h) h = d + b.right + 1;
  *lo = l;
  *hi = h;
}

// The keys visible to each of lq query rows, summed over the rows: a banded problem's work (the
// benches' FLOP counts: 4 x heads x D per visible key of a row).
inline double visible_key_total(const Band& b, int64_t lq, int64_t lk) {
  double total = 0;
  for (int64_t i = 0; i < lq; ++i) {
    int64_t lo = 0, hi = 0;
    visible_keys(b, i, lq, lk, &lo, &hi);
    if (hi > lo) total += static_cast<double>(hi - lo);
  }
  return total;
}

// Element offset of row `row` (sequence-relative when padded, absolute when varlen) of head h of
// batch b in a Q/K/V/Y-shaped tensor with strides st.
BARACUDA_ATTN_HD int64_t row_offset(const int64_t* st, bool varlen, int64_t b, int64_t h,
                                    int64_t row) {
  return varlen ? row * st[0] + h * st[1] : b * st[0] + h * st[1] + row * st[2];
}
// Paged K / V: the element offset of key j of head h of a sequence whose block-table row is
// `table` (its page j / page_size holds the key at row j % page_size of a [pages, H, page_size, D]
// pool with strides st). The page number is clamped into [0, pages): kernels cannot check the
// table (the CPU reference checks it before it runs), and a bad entry must never read outside
// the pool.
// (Key indices, page sizes and counts are ints, as the descriptor's checks bound them: a 32-bit
// division, where a 64-bit one is a call with a stack frame in device code.)
BARACUDA_ATTN_HD int clamp_page(int page, int pages) {
  return page < 0 ? 0 : page >= pages ? pages - 1 : page;
}
BARACUDA_ATTN_HD int page_of(const int32_t* table, int page_size, int pages, int j) {
  return clamp_page(table[j / page_size], pages);
}
// Page sizes whose block-table entries a key tile of `rows` keys reads from one 32-entry register
// window (kernels::PageWindow): pages holding whole tiles, or 2..32 to a tile (powers of two that
// divide it, so a tile's entries never straddle two windows).
BARACUDA_ATTN_HD bool page_window_serves(int page_size, int rows) {
  return page_size > 0 && (page_size % rows == 0 ||
                           (page_size >= 2 && rows % page_size == 0 && rows / page_size <= 32));
}
BARACUDA_ATTN_HD int64_t paged_row_offset(const int64_t* st, const int32_t* table, int page_size,
                                          int pages, int64_t h, int j) {
  return page_of(table, page_size, pages, j) * st[0] + h * st[1] + (j % page_size) * st[2];
}
// The same for LSE: [B, Hq, Lq] padded, [Hq, Tq] varlen.
BARACUDA_ATTN_HD int64_t lse_offset(const int64_t* st, bool varlen, int64_t b, int64_t h,
                                    int64_t row) {
  return varlen ? h * st[0] + row * st[1] : b * st[0] + h * st[1] + row * st[2];
}

// The first rows i0 of the bq-row query tiles (i0 + bq <= lq) whose every row sees all the keys
// [k0, k0 + keys): i0 in [*lo, *hi], empty when *lo > *hi. visible_keys' bounds grow with the row,
// so the tile's last row decides lo <= k0 and its first row hi >= k0 + keys (which needs
// k0 + keys <= lk), each a linear bound on i0. The one-pass backward tests its tiles with it.
// (Lengths, k0, keys and bq are ints, as in the kernel, the band's 64-bit sums not.)
BARACUDA_ATTN_HD void full_tile_rows(const Band& b, int lq, int lk, int k0, int keys, int bq,
                                     int64_t* lo, int64_t* hi) {
  const int64_t off = b.bottom_right ? int64_t{lk} - lq : 0;  // row i's diagonal is i + off
  int64_t l = 0, h = k0 + keys <= lk ? int64_t{lq} - bq : -1;
  if (b.left >= 0) {  // the last row's lo <= k0
    const int64_t c = k0 + b.left - off - (bq - 1);
    h = h < c ? h : c;
  }
  if (b.right >= 0) {  // the first row's hi >= k0 + keys
    const int64_t c = k0 + keys - 1 - b.right - off;
    l = l > c ? l : c;
  }
  *lo = l;
  *hi = h;
}

// Work split of a grid of `blocks` equal work units (key blocks of the one-pass backward, n_it
// iterations each) over `slots` CTAs resident at once. Whole units leave a last, partial wave
// (4096 key blocks on 132 SMs: 31 full waves and 4 blocks, so ~3% of the time 128 SMs idle).
// The stream-K tail: CTAs [0, n_dp) take whole units as before; the last wave and the partial one
// (ctas == slots CTAs) take equal contiguous runs of the remaining units' iterations, so every SM
// ends within about one iteration of the others. A unit a run covers only in part is completed by
// whichever of its runs finishes last (partial sums added in the workspace). No tail (ctas == 0)
// where the units fill whole waves, or where a run would be shorter than two iterations.
// Measured (H100, 6552401 against 1c054c5, one call, medians of three rounds): d64 L4096 +4.3%,
// L16384 +1.7% (4096 blocks); d128 L8192 -0.6% (2048 blocks: a half-full last wave, which runs
// faster than a full one with the other SMs idle, so there was less to win); banded problems keep
// the whole-block grid.
struct TailSplit {
  int64_t n_dp = 0;   // units 0 .. n_dp - 1 run whole, unit u on CTA u
  int64_t ctas = 0;   // CTAs n_dp .. n_dp + ctas - 1 share the rest
  int64_t units = 0;  // units n_dp .. n_dp + units - 1
  int64_t n_it = 0;   // iterations per unit
};
BARACUDA_ATTN_HD TailSplit tail_split(int64_t blocks, int64_t n_it, int64_t slots) {
  TailSplit t;
  t.n_dp = blocks;
  if (slots <= 0 || n_it <= 0 || blocks % slots == 0) return t;
  const int64_t waves = blocks / slots, n_dp = waves > 0 ? (waves - 1) * slots : 0;
  if ((blocks - n_dp) * n_it < 2 * slots) return t;
  t.n_dp = n_dp, t.ctas = slots, t.units = blocks - n_dp, t.n_it = n_it;
  return t;
}
// The one-pass backward's split: key blocks of kBwdKeyBlock, each with group x (query tiles of bq
// rows) iterations, the same for every block only without a band and in padded batches (elsewhere
// no tail: the blocks' work differs).
inline constexpr int64_t kBwdKeyBlock = 128;  // BwdFusedCfg::kKeys
inline int64_t bwd_key_blocks(const Descriptor& d) {
  return d.batch * d.heads_kv * ((d.len_k + kBwdKeyBlock - 1) / kBwdKeyBlock);
}
inline TailSplit bwd_tail_split(const Problem& pr, int64_t bq, int64_t slots) {
  const Descriptor& d = pr.desc;
  const bool uniform = !d.varlen && d.mask.is_none();
  return tail_split(bwd_key_blocks(d), uniform ? pr.group * ((d.len_q + bq - 1) / bq) : 0, slots);
}
// Tail CTA c's run: iterations [*begin, *end) of the tail's units laid end to end (unit
// n_dp + i / n_it, its iteration i % n_it).
BARACUDA_ATTN_HD void tail_run(const TailSplit& t, int64_t c, int64_t* begin, int64_t* end) {
  const int64_t total = t.units * t.n_it;
  *begin = c * total / t.ctas;
  *end = (c + 1) * total / t.ctas;
}
// Segment k of CTA `cta`'s work: unit *unit, its iterations [*it_lo, *it_hi); false past the last.
// A CTA below n_dp has one segment, its whole unit (it_hi = n_it, or -1 without a tail: the
// kernel's own count). Recomputed from k each time, so only k stays live across a segment's work.
BARACUDA_ATTN_HD bool tail_segment(const TailSplit& t, int64_t cta, int64_t k, int64_t* unit,
                                   int64_t* it_lo, int64_t* it_hi) {
  if (cta < t.n_dp) {
    *unit = cta, *it_lo = 0, *it_hi = t.ctas > 0 ? t.n_it : -1;
    return k == 0;
  }
  int64_t begin, end;
  tail_run(t, cta - t.n_dp, &begin, &end);
  const int64_t at = k == 0 ? begin : (begin / t.n_it + k) * t.n_it;  // then unit boundaries
  if (at >= end) return false;
  *unit = t.n_dp + at / t.n_it, *it_lo = at % t.n_it;
  *it_hi = *it_lo + (end - at < t.n_it - *it_lo ? end - at : t.n_it - *it_lo);
  return true;
}

// The CTA waves flash_decode's splits are planned for: the kernel's own (1, or 4 for the w4
// entry), at least 4 for paged caches whose (batch, K/V head) groups alone give every other SM a
// CTA. Such a batch would run one split a group, one lone CTA an SM streaming scattered pages;
// four waves give each SM two resident to overlap them. A paged cache of few groups keeps its
// long one-an-SM splits. H200, bf16 d128, thirty-eighth session, call 3 (the same kernel, the
// split count alone): b16 ragged batch (128 groups) in 64-key pages 38.4-38.9 us a run with one
// wave against 34.1-34.4 with four, in 16-key pages 63.9-64.6 against 43.8-44.2; b1 Lk 32k
// (8 groups) in 64-key pages 42.2-42.5 with one wave against 47.3-47.5 with four.
inline int64_t decode_waves(int64_t kernel_waves, bool paged, int64_t groups, int64_t sms) {
  return paged && 2 * groups > sms ? std::max<int64_t>(kernel_waves, 4) : kernel_waves;
}

// flash_decode's split count (decode_splits in decode.cuh says why, with the measurements):
// `groups` (batch x K/V head) groups of `tiles` 64-key tiles over `slots` CTA slots (SMs x waves),
// one split a slot; where that leaves more than an eighth of the slots idle and `fill` (d64), as
// many as `per_sm` CTAs a slot fill instead. Each split keeps at least `min_tiles` tiles, at most
// 256 splits, and the count is trimmed so that no split is left empty. 1: no split (no combine).
inline int decode_split_count(int64_t groups, int64_t tiles, int64_t slots, bool fill,
                              int64_t per_sm, int64_t min_tiles) {
  if (groups <= 0 || tiles < 8 || slots <= 0) return 1;
  int64_t want = slots / groups;
  if (want * groups < slots - slots / 8 && fill) want = slots * per_sm / groups;
  want = std::min<int64_t>({want, tiles / min_tiles, 256});
  if (want <= 1) return 1;
  const int64_t per = (tiles + want - 1) / want;
  return static_cast<int>((tiles + per - 1) / per);
}

}  // namespace baracuda::attention::detail

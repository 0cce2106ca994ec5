// How fused_mma cuts its walks (host-only; kernels.cuh and the tests share it).
//
// fused_mma gives one block to each (batch row, head) walk over the chunks, one block per SM, so
// its time is the number of waves times a walk's length: 320 walks on 132 SMs are three waves, the
// last 42% full. A walk can instead be cut into segments of consecutive chunks, each its own block,
// the state handed from one segment to the next through the workspace. Blocks take tickets
// (segment-major), so every segment starts after the one before it has started, and, with at least
// a wave of walks, after it has finished: 320 walks in two segments of 8 chunks are five waves of
// 8 chunks instead of three of 16.
#pragma once

#include <algorithm>
#include <cstdint>

namespace baracuda::ssd_segments {

inline constexpr int kMaxSegments = 4;
// A segment's fixed cost (its first loads not overlapped, the state's round trip through L2), in
// quarters of a chunk's time: a guess, it only breaks near-ties toward fewer segments.
inline constexpr int64_t kSegmentCostQuarters = 1;

// The segment count (1..kMaxSegments) with the least waves x (chunks per segment + fixed cost);
// ties go to fewer. `slots`: blocks that run at once (SMs x blocks per SM). Without a wave of walks
// a later segment would wait for the one before it, so cutting is allowed only with walks >= slots,
// unless `at_least` > 1 asks for at least that many segments (the kernel pinned by name in tests;
// correct at any size, it then just waits).
inline int fused_segments(int64_t walks, int64_t nchunks, int64_t slots, int at_least = 1) {
  if (walks <= 0 || nchunks <= 1 || slots <= 0) return 1;
  if (at_least <= 1 && walks < slots) return 1;
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= kMaxSegments && s <= nchunks; ++s) {
    const int64_t per = (nchunks + s - 1) / s;
    if ((s - 1) * per >= nchunks) continue;           // the last segment would be empty
    if (walks > ((int64_t{1} << 31) - 1) / s) break;  // the 1-D grid: walks x segments blocks
    const int64_t waves = (walks * s + slots - 1) / slots;
    const int64_t cost = waves * (4 * per + kSegmentCostQuarters);
    if (s >= std::min(at_least, static_cast<int>(std::min<int64_t>(nchunks, kMaxSegments))) &&
        (best_cost < 0 || cost < best_cost))
      best = s, best_cost = cost;
  }
  return best;
}

// Chunks per segment (the last one may be shorter).
inline int64_t chunks_per_segment(int64_t nchunks, int segments) {
  return segments <= 1 ? nchunks : (nchunks + segments - 1) / segments;
}

}  // namespace baracuda::ssd_segments

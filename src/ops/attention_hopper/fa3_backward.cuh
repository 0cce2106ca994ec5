// fa3_bwd_sm90a: our own Hopper (sm_90a) attention backward (issue 8, part 2), registered into
// attention::BackwardOp's table by name below every other backward kernel
// (PlanPreference::kernel(kFa3BwdKernel); at D = 64 also fa3_bwd_sm90a_k192, three warpgroups,
// and fa3_bwd_sm90a_q128, 128 query rows a step, see BwdShape), and as fa3_bwd_sm90a_ranked_ahead
// above everything, fitting only where the measured selection table (selection_table.hpp) picks
// fa3 and launching fa3_ranked_backward_kernel's one (q128 where fa3_bwd_widens).
//
// Three launches on the caller's stream:
//  1. prep: per query row, delta = rowsum(dY * Y) and lse2 = LSE * log2(e) (+inf for a row that
//     sees no key or lies past Lq, so its probabilities come out 0 without a branch), both f32 in
//     the workspace, padded to whole 128-row blocks; the f32 dQ accumulator is zeroed (or, where
//     a chunk's first add stores, BwdParams::claims, the chunks' claims).
//  2. main: one CTA per 128 keys (D = 256: 64; k192: 192, see BwdShape) of one (batch, key head),
//     looping over the query blocks (64 rows; q128: 128) of every query head of its group, so dK
//     and dV stay in registers and are stored once (the group's sum, no atomics; staged in shared
//     memory and copied out a row per bulk copy). Two warpgroups (k192: three), each owning 64 of
//     the keys (D = 256: all 64 keys, 128 of the head-dim columns each):
//       S^T  = K Q^T        wgmma m64n64k16, both operands K-major from shared memory
//       dP^T = V dY^T       the same
//       P^T  = 2^(S^T * scale * log2(e) - lse2[q])       (masked keys: 0)
//       dV  += P^T dY       wgmma RS: P^T from registers, dY MN-major
//       dS^T = P^T * (dP^T - delta[q])
//       dK  += dS^T Q       wgmma RS
//       dQ   = dS K         dS^T through shared memory (both warpgroups' 64 keys), wgmma SS with
//                           both operands MN-major; D = 128: warpgroup w takes head-dim columns
//                           [64 w, 64 w + 64) over all 128 keys, D = 64: all columns over its own
//                           64 keys; staged in shared memory and added into the f32 accumulator
//                           by a bulk reduce-add (cp.reduce.async.bulk, the adds done in L2).
//                           D = 256: warpgroup w takes columns [128 w, 128 w + 128), 64 at a
//                           time, added from registers by vector atomics (no room to stage).
//     Q, dY, lse2 and delta of a query block arrive by TMA / bulk copy into a 3-stage ring,
//     issued by one thread once every warpgroup is past the block that used the stage last
//     (the per-block barrier that also publishes dS^T); dS^T is double-buffered.
//  3. post: dQ = scale * accumulator, rounded to the 16-bit type, into the caller's strides. The
//     accumulator is [B, Hq, query block, D / 64, 64 x 64 in accumulator-fragment order].
// dK = scale * sum dS^T Q is scaled in the main kernel's epilogue.
//
// Not deterministic: the bulk reductions (D = 256: the atomics) add each query block's dQ
// contributions in whatever order the CTAs reach them. fa3_bwd_sm90a_deterministic (D = 64, 128;
// kDet in the kernel) adds them in a fixed order instead, each CTA waiting its turn per chunk.
// Supports what fa3_fwd_sm90a does (shape_fits, cuda::check_tma_rows), varlen included: the grids
// cover the longest sequence, every CTA or row block reads its sequence's offsets from cu_seqlens
// (key CTAs past their sequence's keys exit), the workspace keeps a [max Lq]-row slab per
// (sequence, query head), and the tiles' rows past a sequence are zeroed in shared memory before
// the GEMMs read them (they belong to other sequences).
//
// Instantiated by fa3_backward_bf16.cu and fa3_backward_f16.cu (see fa3_forward.cuh on the units).
#pragma once
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "baracuda/ops/attention_hopper.hpp"
#include "core/cuda/flags.cuh"
#include "ops/attention_hopper/fa3_common.cuh"

namespace baracuda::attention_hopper::fa3 {
namespace {

using attention::BackwardArguments;

// Query rows of a dQ accumulator chunk, of prep / post's row blocks, and of a step but in
// fa3_bwd_sm90a_q128 (BwdShape's kQRows).
constexpr int kChunkRows = 64;

// How a CTA's two warpgroups share the work, per head dim. D = 64, 128: 128 keys per CTA, each
// warpgroup owning 64 of them (all head-dim columns of their dK and dV). D = 256: one warpgroup's
// dK and dV over 256 columns would take 256 registers a thread, so the CTA holds 64 keys and
// warpgroup w owns head-dim columns [128 w, 128 w + 128) of their dK and dV and of dQ.
// Warpgroup 0 forms S^T and P^T, warpgroup 1 dP^T and dS^T (64 keys x 64 queries, contracted over
// all 256 columns), and they trade P^T and dS^T through shared memory (kExchange in the kernel;
// soft-capped problems, which would need a second traded tile, have both warpgroups form both:
// 1.4x the tensor work). Tiles (K, V 32 KB; Q, dY 32 KB a stage) leave room for a two-stage ring
// in 227 KB. W = 3 (D = 64 alone, fa3_bwd_sm90a_k192): three warpgroups and 192 keys a CTA, so
// that a third warpgroup's GEMMs run while the other two form probabilities (the forward's 192-row
// tiles at D = 64: +7-17%); 168 registers a thread.
template <int D, int W = 2, int Q = 64>
struct BwdShape {
  static constexpr bool kSplitCols = D == 256;
  static constexpr int kThreads = 128 * W;
  static constexpr int kKeys = kSplitCols ? 64 : 64 * W;  // keys per CTA
  static constexpr int kQRows = Q;                        // query rows per step
  // Q / dY / lse2 / delta stages (Q = 128: two, for dS^T's 64 KB)
  static constexpr int kRing = kSplitCols || Q == 128 ? 2 : 3;
  // Only the sm_90a kernel reads kCols (and BwdSmem's kK, kV): elsewhere nvcc flags them unused,
  // and it ignores [[maybe_unused]] on a class template's static members.
#if BARACUDA_FA3_DEVICE
  static constexpr int kCols = kSplitCols ? 128 : D;  // dK / dV columns of a warpgroup
#endif
};

// The deterministic instance's keys a CTA (W = 2, at D = 64 and 128 alike).
inline constexpr int kDetKeys = BwdShape<64>::kKeys;
static_assert(BwdShape<128>::kKeys == kDetKeys);

// Where key block kb of key_blocks starts its walk over the (query head of the group, query
// block) positions, head-major: the rotation that spreads a key head's CTAs over the dQ chunks of
// the group's first query head (`blocks`: its query blocks), so that they walk each head's blocks
// a few steps apart and read the same Q / dY tiles while L2 still holds them. Spread over the
// whole walk instead (every head of the group), the CTAs stood a group's worth of steps apart, and
// at d128 in groups of 4 the default backward read 58% of DRAM's bandwidth with L2 hitting 56%,
// against 6% and 95% for the same kernel ungrouped (2.53 against 2.22 ms, L4096; H200,
// seventy-seventh session). The deterministic post reads it too (which positions a walk reaches
// only after wrapping).
__host__ __device__ constexpr int64_t walk_start(int64_t kb, int64_t blocks, int64_t key_blocks) {
  return kb * blocks / key_blocks;
}

template <int D, int W = 2, int Q = 64>
struct BwdSmem : BwdShape<D, W, Q> {
  using BwdShape<D, W, Q>::kKeys, BwdShape<D, W, Q>::kRing, BwdShape<D, W, Q>::kSplitCols,
      BwdShape<D, W, Q>::kQRows;
  static constexpr int kKvBytes = kKeys * D * 2;       // the K or the V tile
  static constexpr int kQBytes = kQRows * D * 2;       // one step's Q or dY tile
  static constexpr int kDsBytes = kKeys * kQRows * 2;  // dS^T, [key][query]
  static constexpr int kRowBytes = 2 * kQRows * 4;     // lse2 then delta of one step
  // kSplitCols: P^T passes between the warpgroups through kP (double-buffered, dS^T's layout).
#if BARACUDA_FA3_DEVICE  // see BwdShape::kCols
  static constexpr int kK = 0, kV = kKvBytes;
#endif
  static constexpr int kQ = 2 * kKvBytes, kDy = kQ + kRing * kQBytes, kDs = kDy + kRing * kQBytes,
                       kP = kDs + 2 * kDsBytes, kRows = kP + (kSplitCols ? 2 * kDsBytes : 0);
  static constexpr int kStageBytes = kChunkRows * 64 * 4;  // one warpgroup's f32 dQ part
  static constexpr int kStage = kRows + kRing * kRowBytes;
  // D = 256 adds its dQ parts straight from registers (no room for staging).
  static constexpr int kBytes = kStage + (kSplitCols ? 0 : W * kStageBytes);
  static constexpr int kLaunchBytes = kBytes + 1024;  // + alignment slack for 1024-byte atoms
};

struct BwdParams {
  void *dk, *dv;
  float* acc;              // dQ accumulator [B, Hq, lq_pad, D]
  const float* lse2;       // [B, Hq, lq_pad]
  const float* delta;      // [B, Hq, lq_pad]
  int64_t sdk[3], sdv[3];  // dK / dV strides (elements) of the B, H, L axes (varlen: [1, H, T])
  const int *cu_q, *cu_k;  // varlen: sequence offsets (null: padded)
  int total_q, total_k;    // varlen: packed rows
  int lq, lk, lq_pad, group, heads_q;  // lq / lk: the (maximum) lengths
  // The band: row i sees keys d(i) - left .. d(i) + right (-1: unbounded; causal: right 0), its
  // diagonal d(i) = i (top-left) or i + lk - lq (bottom-right).
  int left, right, bottom_right;
  float scale_log2, scale;
  int softcap;              // scores capped as cap * tanh(s * scale / cap)
  float cap_arg, cap_log2;  // scale / cap, cap * log2(e)
  // fa3_bwd_sm90a_deterministic (kDet): per accumulator chunk, the contributions added so far
  // (prep zeroes them), and the counter that hands out CTA tickets. Last, so that the other
  // kernels' parameter offsets stay where they were.
  unsigned* det_counts;
  unsigned* det_ticket;
  // kDet on unmasked problems: the walks rotate, adding into two accumulators (acc's second half)
  // with a set of counts each (det_counts' second half).
  int det_rotated;
  // fa3_bwd_sm90a_heavy_first (not kDet): the grid's blocks taken key block first, so that every
  // (batch, key head)'s lowest key blocks (a causal problem's longest walks) start in the first
  // wave instead of when SMs free up behind the earlier heads' whole rows of key blocks.
  int heavy_first;
  // The ranked entry and fa3_bwd_sm90a_head_split (not kDet, D = 64 / 128, padded): each key
  // block's walk over the group's query heads split over head_parts CTAs (fa3_bwd_head_parts; grid
  // x: key block major, part minor), so that a causal problem's longest walks, a whole group's
  // rows, no longer outlast a wave or two. Each
  // part stores its dK (scaled) and dV in f32 to kv_part ([part][B][Hk][Lk][D], dK's then dV's,
  // kv_part_stride floats apart); fa3_bwd_kv_post sums the parts in order.
  int head_parts;
  float* kv_part;
  int64_t kv_part_stride;
  // Each CTA walks its heads query block by query block from the last, none rotated: kDet's rising
  // order (fa3_bwd_sm90a_deterministic_heavy_first) and fa3_bwd_sm90a_falling (not kDet, with
  // heavy_first), where every key block of a head reads the same Q / dY tiles at the same step.
  int falling_walks;
  // Not kDet, where kClaimsFit (one warpgroup's add a chunk a step), the walks do not fall and
  // fa3_bwd_first_store says (long walks: the claims cost more than the zeroing they save): per
  // accumulator chunk, how many adds have claimed it (low bits, prep zeroes them) and kClaimStored
  // once its first has landed (null: the accumulator zeroed by prep instead). A chunk's first
  // claimant stores its part, the later ones reduce-add once it is marked stored; an add that sees
  // the mark when its step begins takes no claim. The accumulator is never zeroed, and no add into
  // a cold chunk reads its line from DRAM (see fa3_bwd_prep).
  unsigned* claims;
};

// The instances whose step adds one warpgroup's part into each of its dQ chunks (D = 128: a column
// half a warpgroup; q128: a query half), so that a chunk's adds can be claimed one by one
// (BwdParams::claims). Not D = 64 with 64-row steps (every warpgroup adds into the step's one
// chunk: the second would wait on the first at every step) nor D = 256 (vector atomics).
template <int D, int W, int Q, bool kDet>
inline constexpr bool kClaimsFit = !kDet && W == 2 && (D == 128 || Q == 128);
inline constexpr unsigned kClaimStored = 1u << 31;

// The dQ accumulator's chunks (batch, query head, 64-row block, 64-column part), from any of the
// backward's three grids (gridDim.z is the batch in each): where the deterministic instance's
// second half of the accumulator, and of its counts, starts.
template <int D, class P>
__device__ __forceinline__ int64_t acc_chunks(const P& p) {
  return int64_t{gridDim.z} * p.heads_q * (p.lq_pad / kChunkRows) * (D / 64);
}
// The deterministic instance's second half (det_rotated) holds only the chunks a rotated walk
// reaches after it wraps: positions before its start, rot(k) < nm, all of them query blocks of the
// first head of its part's walk (group / head_parts heads a part). So it has one chunk row a part,
// not a head: chunk (part, 64-row block, 64-column part), where part counts the parts of every
// (batch, key head) in order: (b Hk + hk) head_parts + the part, or (b Hq + h) / (group /
// head_parts) for a query head h of it (part_of).
template <int D, class P>
__device__ __forceinline__ int64_t second_chunk(const P& p, int64_t part, int m_blk, int col) {
  return (part * (p.lq_pad / kChunkRows) + m_blk) * (D / 64) + col;
}
template <class P>
__device__ __forceinline__ int64_t part_of(const P& p, int b, int h) {
  return (int64_t{b} * p.heads_q + h) / (p.group / p.head_parts);
}

// The sequence a CTA or row block works on: its packed row offsets (padded: 0), lengths, diagonal
// offset and tensor batch coordinate (varlen: 0).
struct BwdSeq {
  int q0, lq, k0, lk, off, tb;
};

#if BARACUDA_FA3_DEVICE
__device__ __forceinline__ BwdSeq bwd_seq(const BwdParams& p, int b) {
  BwdSeq s{0, p.lq, 0, p.lk, 0, b};
  if (p.cu_q) {
    const SeqRows r = seq_rows(p.cu_q, p.cu_k, b, p.lq, p.lk, p.total_q, p.total_k);
    s = {r.q0, r.lq, r.k0, r.lk, 0, 0};
  }
  if (p.bottom_right) s.off = s.lk - s.lq;
  return s;
}

// An opaque copy: what is derived from it is not loop-invariant to the compiler, so the shared-
// memory descriptors are recomputed per step (a few integer ops each) instead of ~40 of them being
// hoisted out of the loop into registers the accumulators need (at D = 128 that spilled).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}
// kDet's ordering of a chunk's adds (see fa3_bwd_kernel; core/cuda/flags.cuh's count hand-off),
// and BwdParams::claims' wait for a chunk's first add (want kClaimStored): until `want` earlier
// adds are counted (from `seen`, a reading taken a part of the step earlier), then this thread's
// bulk reduction (async proxy); and the count raised once this thread's bulk reductions have
// completed. Polled every 32 ns: with the pause doubling to 1 us (await_count's
// default) the unmasked points from L2048 ran 4.8-9.5% slower, d64 and d128 (H200,
// seventy-fourth session, calls 5 / 6).
__device__ __forceinline__ void await_turn(const unsigned* count, unsigned want, unsigned seen) {
  cuda::await_count(count, want, seen, 32);
  cuda::fence_proxy_async_global();
}
// The raise is relaxed (raise_count_after_completion): the release's MEMBAR.ALL.GPU took 3-15% of
// the backward's time at the sweep's 24 points, d64 and d128, here and at dV's issue alike (H200,
// seventy-fifth session, calls 3-5); the wait for completion here is within the spread.
// (BwdParams::claims raise a chunk's word by kClaimStored, its first add's mark, the same way.)
__device__ __forceinline__ void count_after_completion(unsigned* count, unsigned by = 1) {
  bulk_wait<0, false>();
  cuda::fence_proxy_async_global();
  cuda::raise_count_after_completion(count, by);
}
__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
// The descriptor of `tile + off`: from d0 = desc_sw128(tile, ...) by one add (desc_plus), or
// afresh where kFresh (the kernel's D = 256, where the adds measured slower).
template <bool kFresh>
__device__ __forceinline__ uint64_t desc_off(uint64_t d0, uint32_t tile, uint32_t off, uint32_t lbo,
                                             uint32_t sbo) {
  return kFresh ? desc_sw128(tile + off, lbo, sbo) : desc_plus(d0, off);
}
// acc += A B, one commit group: A (64 rows x Q, the k16 fragments of an accumulator, pack_a)
// from registers, B = one step's Q or dY tile ([Q queries][D], MN-major).
template <class T, int D, bool kFresh, int Q = 64>
__device__ __forceinline__ void issue_rs(float (&acc)[D / 2], const uint32_t (&a)[Q / 16][4],
                                         uint32_t tile) {
  const uint64_t d0 = desc_sw128(tile, Q * 128, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Q / 16; ++kk)
    Ops<T>::template rs<D>(acc, a[kk], desc_off<kFresh>(d0, tile, kk * 16 * 128, Q * 128, 1024));
  wgmma_commit();
}
// Named barriers 2, 3 (and 6 where W = 3): one warpgroup.
template <int W>
__device__ __forceinline__ void sync_warpgroup(int wg) {
  if (wg == 0)
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  else if (W == 2 || wg == 1)
    asm volatile("bar.sync 3, 128;\n" ::: "memory");
  else
    asm volatile("bar.sync 6, 128;\n" ::: "memory");
}
// Named barrier 1 over every warpgroup.
template <int W>
__device__ __forceinline__ void sync_consumers() {
  if constexpr (W == 2)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else
    asm volatile("bar.sync 1, 384;\n" ::: "memory");
}
#endif

// The float4 slot (16 bytes) of thread `tid`'s float4 j in its warpgroup's 16 KB dQ part: j * 128
// + tid, accumulator-fragment order (conflict-free stores). The accumulator chunk in global memory
// has the same order (fa3_bwd_post reads it). A per-warp order, each warp's 4 KB reduced behind
// the next step's dP^T GEMM, measured slower (fa3_bwd_sm90a_warpstaged, 603be39: d128 L4096
// 471 vs 467 TFLOP/s, L16384 435 vs 513, d64 L4096 332 vs 358; H100, 2442818).
__host__ __device__ constexpr int staged_slot(int j, int tid) {
  return j * 128 + tid;
}

// kCap: soft-capping; kVarlen: packed sequences (the tiles' rows past a sequence are zeroed).
// Each in an instantiation of its own, so the plain padded kernel's step carries neither. W: the
// consumer warpgroups (BwdShape).
// kDet (fa3_bwd_sm90a_deterministic; W = 2, Q = 64, D = 64 or 128): dQ's adds into each
// accumulator chunk in one fixed order, so that reruns are bitwise equal. A CTA's (key block, key
// head, batch) comes from a ticket taken at its start, key blocks in falling order within a head,
// and a CTA adds into a chunk only once every CTA of a higher key block that adds into it has (the
// chunk's count in det_counts, waited for by the reducing thread). So a CTA waits only on CTAs
// that started before it: progress does not depend on the order in which the hardware launches
// CTAs or on how many are resident. Falling key blocks suit the band masks: a causal CTA of a
// higher key block starts its walk at a later query block and reaches every shared one first, two
// steps ahead of the next. Unmasked walks (det_rotated) rotate as the other instances' do, which
// puts a higher key block's CTA at a chunk two steps (the rotation's spacing) before the next one
// too, but a chunk's first visitor is then a middle key block: the adds a CTA makes before its walk
// wraps go into the accumulator's first half, those after into its second, and within each the
// visitors come in falling key-block order (see det_want), so a CTA still waits only on CTAs of
// earlier tickets; post sums the halves. (Unrotated, the CTAs of a head walk the chunks in the same
// order, one after another, each waiting at every chunk for the one before.) The count of a
// step's chunk is read under its dQ GEMM and awaited (usually: checked) once dQ is staged; the
// step's add is counted when the next one is issued, long completed by then. At D = 64 warpgroup
// 0 forms dQ over all 128 keys (one add a chunk per CTA) and warpgroup 1 none.
// With heavy_first on unrotated walks (fa3_bwd_sm90a_deterministic_heavy_first) the order turns
// over: tickets rise through the key blocks (the longest causal walks first), each chunk takes
// its adds lowest key block first, and each CTA walks its heads query block by query block from
// the last, so that the key blocks of a head reach a shared chunk at the same step of their walks
// and a CTA still waits only on CTAs of earlier tickets.
template <class T, int D, bool kCap, bool kVarlen, int W = 2, int Q = 64, bool kDet = false>
__global__ void __launch_bounds__(BwdShape<D, W, Q>::kThreads, 1)
    fa3_bwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdy,
                   const BwdParams p) {
#if BARACUDA_FA3_DEVICE
  using S = BwdSmem<D, W, Q>;
  constexpr int kDB = D / 64;  // 64-column blocks per row
  constexpr int kKeys = S::kKeys, kRing = S::kRing, kCols = S::kCols, kQRows = S::kQRows;
  constexpr bool kSplit = S::kSplitCols;
  // A chunk's first add stores, the later ones wait until it has landed (BwdParams::claims).
  constexpr bool kClaims = kClaimsFit<D, W, Q, kDet>;
  const bool claims = kClaims && p.claims != nullptr;
  // q128 (two stages): each stage refilled at the top of the step after the one that read it (see
  // there). The three-stage instances refill after the dQ GEMM: k192 ran 4-10% slower with the
  // early refill (d64, H200, 2026-11-30).
  constexpr bool kEarlyRefill = kQRows == 128;
  extern __shared__ uint8_t smem_raw[];
  // K/V, then one per ring stage, then (kEarlyRefill) one per stage that warpgroup 1 arrives on
  // once its GEMMs of the stage's step are done.
  __shared__ alignas(8) uint64_t bars[1 + kRing + (kEarlyRefill ? kRing : 0)];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  const uint32_t base = smem_u32(smem);
  static_assert(!kDet || (W == 2 && kQRows == 64 && !kSplit), "kDet: D = 64 or 128, W = 2, Q = 64");
  int kb = static_cast<int>(blockIdx.x), hk = static_cast<int>(blockIdx.y),
      b = static_cast<int>(blockIdx.z);
  // head_parts: the CTA's share of the group's query heads (part of parts); key_blocks: the grid's
  // key blocks.
  const int parts = p.head_parts;
  const int key_blocks = static_cast<int>(gridDim.x) / parts;
  // kDet with falling walks (unrotated walks only): tickets key block major, rising, (batch, key
  // head) fastest, each chunk's adds in rising key-block order (see det_before), so that every key
  // block of a head reaches a shared chunk at the same step of its walk and the longest walks
  // start first.
  const bool falling = p.falling_walks != 0;
  if constexpr (kDet) {
    const int ticket = static_cast<int>(cuda::block_ticket(p.det_ticket));
    if (falling) {
      const int pairs = static_cast<int>(gridDim.y * gridDim.z);
      kb = ticket / pairs;
      hk = ticket % pairs % static_cast<int>(gridDim.y);
      b = ticket % pairs / static_cast<int>(gridDim.y);
    } else {
      const int g = static_cast<int>(gridDim.x), per_batch = g * static_cast<int>(gridDim.y);
      kb = g - 1 - ticket % g;
      hk = ticket % per_batch / g;
      b = ticket / per_batch;
    }
  } else if (p.heavy_first) {
    // The hardware hands out blocks in x, y, z order: read that order as (batch, key head)
    // fastest, key block slowest.
    const uint64_t heads = gridDim.y, pairs = heads * gridDim.z,
                   linear = blockIdx.x + uint64_t{gridDim.x} * (blockIdx.y + heads * blockIdx.z);
    kb = static_cast<int>(linear / pairs);
    hk = static_cast<int>(linear % pairs % heads);
    b = static_cast<int>(linear % pairs / heads);
  }
  // (kDet: a ticket's x falls with the ticket, so that a key block's parts follow every part of
  // the higher key blocks, which each add before it into the chunks of its heads.)
  const int part = kb % parts, part_heads = p.group / parts;
  kb /= parts;
  const int n0 = kb * kKeys;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  // The warpgroup broadcast from lane 0, so that the compiler knows it is warp-uniform and derives
  // the wgmma descriptors in uniform registers (computed per thread, every descriptor crossed over
  // with an R2UR: d128 L4096 / L8192 2.5% slower, d256 L4096 3.1% slower). D = 64, 128: each
  // wgmma's descriptors one add from the GEMM's first (desc_off: d64 L4096 4% faster, d128 the
  // same); D = 256 derives them afresh: the increments ran 3.3% slower there (389 against 403
  // TFLOP/s at L4096). H200, 2026-11-30.
  constexpr bool kFresh = D == 256;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0), wl = warp % 4;
  const int cq = 2 * (lane % 4);  // first column of each 8-column accumulator group

  // The CTA's sequence; a varlen CTA past its sequence's keys has nothing to write.
  const BwdSeq sq_ = bwd_seq(p, b);
  const int lk = sq_.lk, off = sq_.off;
  if (n0 >= lk) return;
  // Query blocks that see some key of this CTA: row i sees keys i + off - left .. i + off + right.
  const int m_begin =
      p.right >= 0 ? static_cast<int>(max(int64_t{0}, int64_t{n0} - off - p.right)) / kQRows : 0;
  const int m_rows =
      p.left >= 0 ? static_cast<int>(
                        min(int64_t{sq_.lq}, max(int64_t{0}, int64_t{n0} + kKeys - off + p.left)))
                  : sq_.lq;
  const int nm = max(0, (m_rows + kQRows - 1) / kQRows - m_begin);
  const int steps = nm * part_heads;
  // The CTAs of one key head run side by side and would add into the same dQ chunk at the same
  // time (L2 serializes same-address reductions): each starts its walk over the (head, query
  // block) steps at its own offset, spread evenly over the key blocks.
  // (kDet: only unmasked walks, see there.)
  const bool rotates = !kDet || p.det_rotated;
  const int rot = rotates && steps > 0 ? static_cast<int>(walk_start(kb, nm, key_blocks)) : 0;
  // A step's place in that walk: (query head of the group, query block), advanced by increments
  // rather than divided out per step, since the ring's refill (warp 0) and each step's head and
  // block sit on the path to warpgroup-wide GEMMs.
  struct Pos {
    int hh, m;
  };
  auto next_pos = [&](Pos q) {
    if (falling) {
      if (++q.hh == part_heads) q.hh = 0, --q.m;
      return q;
    }
    if (++q.m == nm) {
      q.m = 0;
      if (++q.hh == part_heads) q.hh = 0;
    }
    return q;
  };
  auto pos_head = [&](Pos q) { return hk * p.group + part * part_heads + q.hh; };
  auto pos_row0 = [&](Pos q) { return (m_begin + q.m) * kQRows; };
  const Pos first = steps > 0 ? (falling ? Pos{0, nm - 1} : Pos{rot / nm, rot % nm}) : Pos{0, 0};

  if (threadIdx.x == 0) {
    for (int i = 0; i < 1 + kRing; ++i) mbar_init(smem_u32(&bars[i]), 1);
    if constexpr (kEarlyRefill)
      for (int i = 1 + kRing; i < 1 + 2 * kRing; ++i) mbar_init(smem_u32(&bars[i]), W - 1);
    cuda::mbar_init_fence();
  }
  __syncthreads();

  auto load_step = [&](int t, Pos q) {
    const int s = t % kRing, h = pos_head(q), m0 = pos_row0(q);
    const uint32_t bar = smem_u32(&bars[1 + s]);
    mbar_expect_tx(bar, 2 * S::kQBytes + S::kRowBytes);
    const int q_row = sq_.q0 + m0;
#pragma unroll
    for (int db = 0; db < kDB; ++db) {
      tma_load_4d(base + S::kQ + s * S::kQBytes + db * kQRows * 128, &tq, bar, db * 64, q_row, h,
                  sq_.tb);
      tma_load_4d(base + S::kDy + s * S::kQBytes + db * kQRows * 128, &tdy, bar, db * 64, q_row, h,
                  sq_.tb);
    }
    const int64_t row = (int64_t{b} * p.heads_q + h) * p.lq_pad + m0;
    bulk_load(base + S::kRows + s * S::kRowBytes, p.lse2 + row, kQRows * 4, bar);
    bulk_load(base + S::kRows + s * S::kRowBytes + kQRows * 4, p.delta + row, kQRows * 4, bar);
  };
  if (threadIdx.x == 0 && steps > 0) {
    const uint32_t bar = smem_u32(&bars[0]);
    mbar_expect_tx(bar, 2 * S::kKvBytes);
#pragma unroll
    for (int db = 0; db < kDB; ++db) {
      tma_load_4d(base + S::kK + db * kKeys * 128, &tk, bar, db * 64, sq_.k0 + n0, hk, sq_.tb);
      tma_load_4d(base + S::kV + db * kKeys * 128, &tv, bar, db * 64, sq_.k0 + n0, hk, sq_.tb);
    }
    Pos q = first;
    for (int t = 0; t < min(steps, kRing); ++t, q = next_pos(q)) load_step(t, q);
  }

  float dv[kCols / 2], dk[kCols / 2];
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) dv[i] = dk[i] = 0.f;
  // This thread's accumulator rows (keys) of S^T / dP^T / dK / dV: key0 and key0 + 8. The
  // warpgroup's first key row in the CTA's tiles (kSplit: both warpgroups hold all 64).
  const int wg_key = kSplit ? 0 : wg * 64;
  const int key0 = n0 + wg_key + wl * 16 + lane / 4;
  // kSplit: the byte offset of this warpgroup's 128 columns in a Q or dY tile.
  const uint32_t wg_cols = kSplit ? static_cast<uint32_t>(wg * 2 * kQRows * 128) : 0u;
  // The mask's per-thread constants: this thread's two keys past Lk, and the band as limits on
  // key - diagonal (an unbounded side as 2^30, which no difference reaches: shape_fits keeps
  // Lq + Lk below 2^30).
  const bool past0 = key0 >= lk, past1 = key0 + 8 >= lk;
  constexpr int kUnbounded = 1 << 30;
  const int right_lim = p.right >= 0 ? p.right : kUnbounded;
  const int left_lim = p.left >= 0 ? -p.left : -kUnbounded;
  // S^T = K Q^T (once the step's stage has landed) and dP^T = V dY^T of step t: this
  // warpgroup's 64 keys x the step's 64 queries, one commit group each.
  float st[kQRows / 2];
  // kExchange (D = 256 without soft-capping): instead of both warpgroups forming S^T and dP^T,
  // warpgroup 0 forms S^T and P^T, warpgroup 1 dP^T, and they trade P^T and dS^T through shared
  // memory (1.4x less tensor work; P^T enters dS^T rounded to the 16-bit type, as it enters dV).
  // Soft-capping would need a second exchanged tile (P^T and P^T (1 - tanh^2)): no room.
  constexpr bool kExchange = kSplit && !kCap;
  // kLean (W = 3, 168 registers a thread; not soft-capped): P^T packed as it is formed and dS^T
  // formed from the packed P^T, as kExchange does, so that S^T's 32 registers die before dP^T's
  // are read (with them live as well ptxas serialized every wgmma: C7512).
  constexpr bool kLean = (W == 3 || Q == 128) && !kCap;
  const int own_rows = kExchange && wg == 1 ? S::kV : S::kK;
  const int own_tile = kExchange && wg == 1 ? S::kDy : S::kQ;
  // `sb` is the shared-memory base through opaque() (see there); the A operand is this
  // warpgroup's 64 rows of K (`rows` = S::kK) or V (S::kV), B the step's Q or dY tile.
  auto issue_scores = [&](int t, float(&acc)[kQRows / 2], uint32_t sb, int rows_at, int tile) {
    const int s = t % kRing;
    const uint32_t rows = sb + rows_at + wg_key * 128, tile_base = sb + tile + s * S::kQBytes;
    const uint64_t da = desc_sw128(rows, 16, 1024), db = desc_sw128(tile_base, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t koff = (kk / 4) * kKeys * 128 + (kk % 4) * 32;
      const uint32_t qoff = (kk / 4) * kQRows * 128 + (kk % 4) * 32;
      Ops<T>::template ss<kQRows>(acc, desc_off<kFresh>(da, rows, koff, 16, 1024),
                                  desc_off<kFresh>(db, tile_base, qoff, 16, 1024), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // Varlen: rows past the sequence in a query block's Q / dY tiles (and in the CTA's K / V, see
  // below) are other sequences' rows: their probabilities are 0, but 0 * a non-finite value is
  // NaN in the GEMMs that read the tiles, so they are zeroed before the first GEMM. Each
  // warpgroup zeroes them before its own GEMMs (the other one may be writing the same zeros).
  auto issue_s = [&](int t, int m0) {
    mbar_wait(smem_u32(&bars[1 + t % kRing]), (t / kRing) & 1);
    if constexpr (kVarlen) {
      const int valid = sq_.lq - m0;
      if (valid < kQRows) {
        const uint32_t sb = opaque(base);
        const int s = t % kRing, tid = static_cast<int>(threadIdx.x) % 128;
        zero_rows<D>(sb + S::kQ + s * S::kQBytes, kQRows, valid, tid, 128);
        zero_rows<D>(sb + S::kDy + s * S::kQBytes, kQRows, valid, tid, 128);
        fence_proxy_async();
        sync_warpgroup<W>(wg);
      }
    }
    issue_scores(t, st, opaque(base), own_rows, own_tile);
  };
  // This warpgroup's accumulator chunk for query head h, query rows from m0: (batch, head,
  // query block, 64-column part).
  auto chunk_of = [&](int h, int m0) {
    return ((int64_t{b} * p.heads_q + h) * (p.lq_pad / kChunkRows) + m0 / kChunkRows) * (D / 64) +
           (D == 128 ? wg : 0);
  };
  // Where this thread's word x of k16 step kk of an accumulator-layout 64 x 64 tile lives in a
  // [key][query] tile (dS^T, P^T: 128-byte rows, 128-byte swizzle).
  auto tile_addr = [&](uint32_t tile, int kk, int x) {
    const int r = wg_key + wl * 16 + lane / 4 + 8 * (x & 1), chunk = 2 * kk + (x >> 1);
    // Q = 128: queries 64 c on in 128-byte column block c (kKeys rows each).
    return tile + (chunk / 8) * (kKeys * 128) + r * 128 + (((chunk % 8) ^ (r % 8)) * 16) + cq * 2;
  };
  // kSplit: dQ = dS K for this warpgroup's 128 columns, 64 at a time (32 accumulator registers,
  // as the other head dims), each added into its accumulator chunk by vector atomics in the
  // chunk's fragment order (staged_slot); the next step's score GEMM is issued before the last
  // adds, so they run under it (the last step issues its own again, see below).
  auto split_dq_and_next = [&](int t, int h, int m0, int m0_next, uint32_t ds, uint32_t sb) {
    const int tid = static_cast<int>(threadIdx.x) % 128;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int cb = 2 * wg + half;  // 64-column block of dQ and K
      const uint32_t kb = sb + S::kK + cb * kKeys * 128;
      const uint64_t da = desc_sw128(ds, 8192, 1024), db = desc_sw128(kb, 8192, 1024);
      float dq[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        Ops<T>::tt64(dq, desc_off<kFresh>(da, ds, kk * 16 * 128, 8192, 1024),
                     desc_off<kFresh>(db, kb, kk * 16 * 128, 8192, 1024), kk > 0 ? 1 : 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);
      if (half == 1) {
        if (t + 1 < steps)
          issue_s(t + 1, m0_next);
        else
          issue_scores(t, st, sb, own_rows, own_tile);
      }
      float4* chunk = reinterpret_cast<float4*>(p.acc + (chunk_of(h, m0) + cb) * (kChunkRows * 64));
#pragma unroll
      for (int j = 0; j < 8; ++j)
        atomicAdd(chunk + staged_slot(j, tid),
                  make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
    }
  };
  if (steps > 0) {
    mbar_wait(smem_u32(&bars[0]), 0);
    if (kVarlen && n0 + kKeys > lk) {
      zero_rows<D>(base + S::kK, kKeys, lk - n0, static_cast<int>(threadIdx.x), S::kThreads);
      zero_rows<D>(base + S::kV, kKeys, lk - n0, static_cast<int>(threadIdx.x), S::kThreads);
      fence_proxy_async();
      sync_consumers<W>();
    }
    issue_s(0, pos_row0(first));
    wgmma_wait<0>();
  }

  // Software-pipelined: step t + 1's S^T GEMM is issued once step t's dQ is staged, so the
  // tensor cores have it while this warpgroup adds dQ_t into the accumulator; dP^T_t is issued at
  // the top of step t and runs under P^T's exponentials.
  // This thread's lse2 / delta words in stage 0 (kExchange reads them its own way).
  const uint32_t row_stats_at = kExchange ? 0u : opaque(base + S::kRows + cq * 4);
  // kDet: the adds into the chunk of query rows m0.. that come before this CTA's, one from each
  // higher key block whose walk holds that query block (a contiguous run from this one: a key
  // block's first query block rises with it, see m_begin, and its last does too). The reducing
  // thread's chunk whose add is still to be counted (-1: none).
  auto det_before = [&](int m0) {
    if (falling) {
      // The lower key blocks that see the chunk: from the one holding its first row's first key.
      const int64_t first_key = int64_t{m0} + off - p.left;
      const int lo = p.left < 0 || first_key <= 0 ? 0 : static_cast<int>(first_key / kKeys);
      return static_cast<unsigned>(kb - min(lo, kb));
    }
    int hi = (lk + kKeys - 1) / kKeys - 1;
    if (p.right >= 0) {
      const int64_t lim = int64_t{m0} + kQRows + off + p.right - 1;
      hi = lim < 0 ? kb : static_cast<int>(min(int64_t{hi}, lim / kKeys));
    }
    return static_cast<unsigned>(max(hi, kb) - kb);
  };
  // Rotated (det_rotated; unmasked: every CTA of the sequence walks the same positions, key block k
  // from rot(k) = k * nm / gridDim.x on): the visitors of position pos before their walks wrap
  // are the key blocks k with rot(k) <= pos, after it the rest; this CTA's predecessors are the
  // higher key blocks of its part (in 32 bits: see det_rotates). Step t's count and accumulator
  // chunk: those of the second half once the walk has wrapped (second_chunk).
  const int64_t det_chunks = acc_chunks<D>(p);
  auto det_want = [&](int t, Pos q, int m0) {
    if (!p.det_rotated) return det_before(m0);
    const int blocks = (lk + kKeys - 1) / kKeys;
    if (t >= steps - rot) return static_cast<unsigned>(blocks - 1 - kb);
    const unsigned pos = static_cast<unsigned>(q.hh * nm + q.m),
                   last = ((pos + 1) * static_cast<unsigned>(key_blocks) - 1) /
                          static_cast<unsigned>(nm);
    return min(last, static_cast<unsigned>(blocks - 1)) - static_cast<unsigned>(kb);
  };
  // The reducing thread's chunk (an index into det_counts and into the accumulator's chunks) whose
  // add is still to be counted (-1: none); this step's chunk, the adds it waits for, and its count
  // as last read.
  int64_t det_pending = -1, det_at = 0;
  unsigned det_need = 0, det_seen = 0;
  // claims: the reducing thread's stored chunk not yet marked (-1: none), and this step's claim
  // (the chunk's claims before it; 0: the first; kClaimStored set: its first add had landed when
  // the step began, and no claim was taken).
  int64_t claim_pending = -1;
  unsigned claim_seen = 0;
  Pos cur = first;
  for (int t = 0; t < steps; ++t) {
    const int s = t % kRing, h = pos_head(cur), m0 = pos_row0(cur);
    // The accumulator chunk this warpgroup's dQ part of the step goes to (q128: its query half).
    auto step_chunk = [&] { return chunk_of(h, m0 + (kQRows == 128 ? wg * kChunkRows : 0)); };
    // claims: the step's chunk read here, its round trip under the step's first GEMMs. Once its
    // first add is marked stored the step takes no claim: past a chunk's first adds no step's
    // reduce-add waits on an atomic's returned value.
    if (claims && threadIdx.x % 128 == 0) claim_seen = cuda::peek_count(p.claims + step_chunk());
    const Pos nxt = next_pos(cur);
    // Step t + kRing - 1's place, for the load that refills step t - 1's stage.
    auto ahead = [&] {
      Pos q = nxt;
#pragma unroll
      for (int i = 2; i < kRing; ++i) q = next_pos(q);
      return q;
    };
    const uint32_t sb = opaque(base);
    const uint32_t sq = sb + S::kQ + s * S::kQBytes, sdy = sb + S::kDy + s * S::kQBytes;
    const uint32_t lse2 = sb + S::kRows + s * S::kRowBytes, delta = lse2 + kQRows * 4;
    if constexpr (kExchange) {
      // st holds S^T_t (warpgroup 0) or dP^T_t (warpgroup 1), issued at the end of step t - 1.
      fence_regs(st);
      const uint32_t pt = sb + S::kP + (t & 1) * S::kDsBytes,
                     ds = sb + S::kDs + (t & 1) * S::kDsBytes;
      // A k16 fragment set ([4][4] words) to or from a [key][query] tile.
      auto put = [&](uint32_t tile, const uint32_t(&a)[4][4]) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile_addr(tile, kk, x)), "r"(a[kk][x])
                         : "memory");
      };
      auto get = [&](uint32_t tile, uint32_t(&a)[4][4]) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            asm volatile("ld.shared.b32 %0, [%1];\n"
                         : "=r"(a[kk][x])
                         : "r"(tile_addr(tile, kk, x))
                         : "memory");
      };
      uint32_t pa[4][4], dsa[4][4];
      const int d_lo = m0 + off;
      const int rel0 = key0 - d_lo - cq;
      if (wg == 0) {
        const bool masked = n0 + kKeys > lk || (p.right >= 0 && n0 + kKeys - 1 > d_lo + p.right) ||
                            (p.left >= 0 && n0 < d_lo + kQRows - 1 - p.left);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 l = ld_shared_f2(lse2 + (8 * j + cq) * 4);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int rel = rel0 - 8 * j + (8 * (e >> 1) - (e & 1));
            const bool hide = ((e >> 1) ? past1 : past0) | (rel > right_lim) | (rel < left_lim);
            const float v = fast_exp2(fmaf(st[4 * j + e], p.scale_log2, -((e & 1) ? l.y : l.x)));
            st[4 * j + e] = masked && hide ? 0.f : v;
          }
        }
        pack_a<T, 64>(st, pa);
        put(pt, pa);
        asm volatile("bar.arrive 4, 256;\n" ::: "memory");  // P^T_t published
      } else {
        asm volatile("bar.sync 4, 256;\n" ::: "memory");
        get(pt, pa);
      }
      issue_rs<T, kCols, kFresh>(dv, pa, sdy + wg_cols);
      if (wg == 1) {
        // dS^T = P^T (dP^T - delta), P^T as warpgroup 0 rounded it.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 dl = ld_shared_f2(delta + (8 * j + cq) * 4);
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const float2 pr = cuda::unpack2<T>(pa[j / 2][2 * (j % 2) + h2]);
            st[4 * j + 2 * h2] = pr.x * (st[4 * j + 2 * h2] - dl.x);
            st[4 * j + 2 * h2 + 1] = pr.y * (st[4 * j + 2 * h2 + 1] - dl.y);
          }
        }
        pack_a<T, 64>(st, dsa);
        put(ds, dsa);
        fence_proxy_async();  // the dQ GEMMs read dS^T through the async proxy
        asm volatile("bar.arrive 5, 256;\n" ::: "memory");  // dS^T_t published
      } else {
        asm volatile("bar.sync 5, 256;\n" ::: "memory");
        get(ds, dsa);
        // Warpgroup 1 is past dS^T_t, so both are past step t - 1: its stage is free.
        if (threadIdx.x == 0 && t >= 1 && t + kRing - 1 < steps) load_step(t + kRing - 1, ahead());
      }
      issue_rs<T, kCols, kFresh>(dk, dsa, sq + wg_cols);
      split_dq_and_next(t, h, m0, pos_row0(nxt), ds, sb);
    } else {
      float dpt[kQRows / 2];
      issue_scores(t, dpt, sb, S::kV, S::kDy);  // S^T_t is done (see the end of the step)
      // kEarlyRefill: stage (t - 1) % kRing is refilled here, at the top of step t, once the other
      // warpgroup reports its GEMMs of step t - 1 done (this one's are), a whole step before step
      // t + 1 reads it. Refilled after the dQ GEMM of step t, step t + 1's load had only the
      // GEMMs' drain to land in: ncu had its wait at 4% of the warps' time (d64 L2048); q128 ran
      // 1-6% faster at every d64 point with it (H200, 2026-11-30).
      if constexpr (kEarlyRefill) {
        if (threadIdx.x == 0 && t >= 1 && t + kRing - 1 < steps) {
          mbar_wait(smem_u32(&bars[1 + kRing + (t - 1) % kRing]), ((t - 1) / kRing) & 1);
          load_step(t + kRing - 1, ahead());
        }
      }
      fence_regs(st);
      // The step's stage offset for the lse2 / delta loads through a copy of its own: derived from
      // the stage index as the GEMMs' tile addresses are, ptxas held the index in a vector
      // register for these per-thread addresses and took the dV / dK descriptors from it too, an
      // R2UR pair a wgmma (q128: 42 in the loop, 1381 instructions against 1279 without).
      const uint32_t row_off = opaque(s * S::kRowBytes);

      // P^T (column c is query m0 + c) as the A fragments of dV += P^T dY (pack_a's order), and in
      // place what dS^T needs of it: P^T, times d(capped)/d(scaled score) = 1 - tanh^2 when
      // soft-capped.
      // (int arithmetic: shape_fits keeps Lq + Lk, so every diagonal and bound, below 2^30.)
      const int d_lo = m0 + off;  // the step's first diagonal
      const bool masked = n0 + kKeys > lk || (p.right >= 0 && n0 + kKeys - 1 > d_lo + p.right) ||
                          (p.left >= 0 && n0 < d_lo + kQRows - 1 - p.left);
      // Element (j, e) holds key key0 + 8 (e >> 1) and diagonal d_lo + 8 j + cq + (e & 1): their
      // difference is rel0 - 8 j + (8 (e >> 1) - (e & 1)). Hidden (probability 0) past Lk or
      // outside the band, tested without branches so the masked loop stays one straight block.
      const int rel0 = key0 - d_lo - cq;
      auto hidden = [&](int j, int e) {
        const int rel = rel0 - 8 * j + (8 * (e >> 1) - (e & 1));
        return ((e >> 1) ? past1 : past0) | (rel > right_lim) | (rel < left_lim);
      };
      uint32_t pa[kQRows / 16][4];
      // Two straight-line copies of the loop (the branch on `masked` is uniform over the CTA): the
      // unmasked one, most steps of a long row, is exponentials alone.
      auto probabilities = [&](auto masked_tag) {
        constexpr bool kMasked = decltype(masked_tag)::value;
        if constexpr (kCap || kLean) {
          // P packed for dV as it is formed: soft-capped, so that st can hold P (1 - tanh^2);
          // kLean, so that st's registers free one column group at a time.
#pragma unroll
          for (int j = 0; j < kQRows / 8; ++j) {
            const float2 l = ld_shared_f2(row_stats_at + row_off + 8 * j * 4);
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float lse = (e & 1) ? l.y : l.x;
              if constexpr (kCap) {
                const float th = fast_tanh(st[4 * j + e] * p.cap_arg);
                v[e] = fast_exp2(fmaf(th, p.cap_log2, -lse));
                if constexpr (kMasked) v[e] = hidden(j, e) ? 0.f : v[e];
                st[4 * j + e] = v[e] * fmaf(-th, th, 1.f);
              } else {
                v[e] = fast_exp2(fmaf(st[4 * j + e], p.scale_log2, -lse));
                if constexpr (kMasked) v[e] = hidden(j, e) ? 0.f : v[e];
              }
            }
            pa[j / 2][2 * (j % 2)] = cuda::pack2<T>(v[0], v[1]);
            pa[j / 2][2 * (j % 2) + 1] = cuda::pack2<T>(v[2], v[3]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kQRows / 8; ++j) {
            const float2 l = ld_shared_f2(row_stats_at + row_off + 8 * j * 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float v = fast_exp2(fmaf(st[4 * j + e], p.scale_log2, -((e & 1) ? l.y : l.x)));
              if constexpr (kMasked) v = hidden(j, e) ? 0.f : v;
              st[4 * j + e] = v;
            }
          }
          pack_a<T, kQRows>(st, pa);
        }
      };
      if (masked) {
        probabilities(std::true_type{});
      } else {
        probabilities(std::false_type{});
      }
      issue_rs<T, kCols, kFresh, kQRows>(dv, pa, sdy + wg_cols);
      wgmma_wait<1>();  // dP^T done; dV may still run
      fence_regs(dpt);

      // dS^T = P^T (dP^T - delta), then dK += dS^T Q. kLean: P^T as rounded for dV.
#pragma unroll
      for (int j = 0; j < kQRows / 8; ++j) {
        const float2 dl = ld_shared_f2(row_stats_at + row_off + (kQRows + 8 * j) * 4);
        if constexpr (kLean) {
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const float2 pr = cuda::unpack2<T>(pa[j / 2][2 * (j % 2) + h2]);
            dpt[4 * j + 2 * h2] = pr.x * (dpt[4 * j + 2 * h2] - dl.x);
            dpt[4 * j + 2 * h2 + 1] = pr.y * (dpt[4 * j + 2 * h2 + 1] - dl.y);
          }
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? dl.y : dl.x));
        }
      }
      uint32_t dsa[kQRows / 16][4];
      pack_a<T, kQRows>(dpt, dsa);
      issue_rs<T, kCols, kFresh, kQRows>(dk, dsa, sq + wg_cols);

      // dS^T into shared memory ([key][query], 128-byte rows, 128-byte swizzle) for dQ = dS K.
      const uint32_t ds = sb + S::kDs + (t & 1) * S::kDsBytes;
#pragma unroll
      for (int kk = 0; kk < kQRows / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          // kSplit: both warpgroups hold the same dS^T; each stores half of its queries.
          if (kSplit && kk / 2 != wg) continue;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile_addr(ds, kk, x)), "r"(dsa[kk][x])
                       : "memory");
        }
      fence_proxy_async();
      // Both warpgroups' dS^T are written, and both are past step t - 1 (its wgmmas waited for):
      // stage (t - 1) % kRing is free for step t + kRing - 1. Each warpgroup's dQ staging buffer is
      // free once its previous bulk reduction has read it: the barrier publishes that too.
      // claims: the last step's store, if it was a chunk's first, marked here (its completion
      // waited for in place of the staging read's), before anything this warpgroup waits for on
      // the other: a claimant then never holds an unmarked store while it waits, so every wait
      // ends (the mark a step's adds wait for comes before its storer's next wait of any kind).
      if (!kSplit && threadIdx.x % 128 == 0) {
        if (kClaims && claim_pending >= 0) {
          count_after_completion(p.claims + claim_pending, kClaimStored);
          claim_pending = -1;
        } else {
          bulk_wait<0, true>();
        }
      }
      sync_consumers<W>();
      // Refilling stage (t - 1) % kRing: at D = 256 here; with the staged dQ once its GEMM is
      // issued, so that warp 0's share of that warpgroup-wide GEMM does not wait behind the load
      // (q128: at the top of the step instead, see kEarlyRefill).
      const bool refill = threadIdx.x == 0 && t >= 1 && t + kRing - 1 < steps;
      if constexpr (kSplit) {
        if (refill) load_step(t + kRing - 1, ahead());
        split_dq_and_next(t, h, m0, pos_row0(nxt), ds, sb);
      } else {
        // D = 128: this warpgroup's 64 columns of K over all 128 keys (the CTA's dS^T);
        // D = 64: all columns over its own 64 keys (its rows of dS^T and K); Q = 128: all columns
        // for its 64 of the step's queries (dS^T's column block wg) over all 128 keys.
        // kDet at D = 64: warpgroup 0 over all 128 keys, as D = 128 (see the kernel).
        constexpr bool kQ128 = kQRows == 128, kDetD64 = kDet && D == 64;
        constexpr int kDqKeys = D == 128 || kQ128 || kDetD64 ? kKeys : 64;
        const uint32_t da_at = ds + (D == 128 || kDetD64 ? 0
                                     : kQ128             ? wg * kKeys * 128
                                                         : wg * 64 * 128),
                       db_at = sb + S::kK + (kQ128 || kDetD64 ? 0 : wg * kDqKeys * 128);
        if (kDetD64 && wg == 1) {
          // kDet at D = 64: no dQ here (warpgroup 0 forms it over all 128 keys).
          if (t + 1 < steps)
            issue_s(t + 1, pos_row0(nxt));
          else
            issue_scores(t, st, sb, S::kK, S::kQ);
        } else {
          const uint64_t da = desc_sw128(da_at, 8192, 1024), db = desc_sw128(db_at, 8192, 1024);
          float dq[32];
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kDqKeys / 16; ++kk)
            Ops<T>::tt64(dq, desc_off<kFresh>(da, da_at, kk * 16 * 128, 8192, 1024),
                         desc_off<kFresh>(db, db_at, kk * 16 * 128, 8192, 1024), kk > 0 ? 1 : 0);
          wgmma_commit();
          // kDet: this step's count read under the dQ GEMM and awaited once dQ is staged (the
          // load's round trip, about 300 ns, was a tenth of the d128 step where it was read there:
          // H200, seventy-fifth session's trace). After the GEMM's issue, not before: the
          // predecessor rule's arithmetic and the load's issue held warp 0 back, and with it the
          // warpgroup-wide GEMM (ncu, d128 L4096: its first wgmma's stall samples 17x the
          // non-deterministic kernel's with the reading before it, 44x with an acquire reading).
          if constexpr (kDet) {
            if (threadIdx.x % 128 == 0) {
              det_at = t >= steps - rot
                           ? det_chunks +
                                 second_chunk<D>(p, (int64_t{b} * gridDim.y + hk) * parts + part,
                                                 m0 / kChunkRows, 0) +
                                 (D == 128 ? wg : 0)
                           : chunk_of(h, m0);
              det_need = det_want(t, cur, m0);
              det_seen = cuda::peek_count(p.det_counts + det_at);
            }
          }
          // claims: this step's claim taken here for the same reason (its atomic's round trip
          // under the GEMM), before its part is staged, unless the step's first reading saw the
          // chunk's first add landed.
          const int64_t chunk = step_chunk();
          if (claims && threadIdx.x % 128 == 0 && claim_seen < kClaimStored)
            claim_seen = atomicAdd(p.claims + chunk, 1u);
          if (!kEarlyRefill && refill) load_step(t + kRing - 1, ahead());
          wgmma_wait<0>();  // dQ_t (and every older group) done
          if (kEarlyRefill && wg > 0 && threadIdx.x % 128 == 0)
            mbar_arrive(smem_u32(&bars[1 + kRing + s]));
          fence_regs(dq);
          // dQ_t into the accumulator: this warpgroup's 64 x 64 f32 part, staged in shared memory
          // in accumulator-fragment order (conflict-free stores; see staged_slot), then bulk
          // reduce-adds. D = 64: both warpgroups add into the same chunk. S^T_{t+1} is issued
          // between the staging stores and the proxy fence that waits for them, so the stores land
          // while it issues (the fence was the largest stall in ncu when S^T_{t+1} went first,
          // behind the dQ GEMM: H100, d128 L4096 476 -> 504 TFLOP/s in one call, d64 unchanged).
          // The last step issues its own S^T again (its stage is still resident): an S^T GEMM on
          // every path keeps the accumulator registers' definitions unconditional, which ptxas
          // needs to keep the wgmmas asynchronous.
          {
            const int tid = static_cast<int>(threadIdx.x) % 128;
            const uint32_t stage = sb + S::kStage + wg * S::kStageBytes;
#pragma unroll
            for (int j = 0; j < 8; ++j)
              asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                               stage + staged_slot(j, tid) * 16),
                           "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]),
                           "f"(dq[4 * j + 3])
                           : "memory");
            if (t + 1 < steps)
              issue_s(t + 1, pos_row0(nxt));
            else
              issue_scores(t, st, sb, S::kK, S::kQ);
            fence_proxy_async();
            sync_warpgroup<W>(wg);
            if (tid == 0) {
              int64_t at = chunk;
              if constexpr (kDet) {
                // The previous step's add, counted now that it has long completed (counted at dV's
                // issue, half a step after it, the wait for completion and the release took 10-20%
                // of the kernel's time in the seventy-fifth session's trace).
                if (det_pending >= 0) count_after_completion(p.det_counts + det_pending);
                await_turn(p.det_counts + det_at, det_need, det_seen);
                det_pending = at = det_at;
              }
              // kDet: a chunk's first adder stores its part (prep zeroes no rotated accumulator,
              // and a store needs no line from DRAM that a reduce-add into a cold chunk reads).
              // claims: the chunk's first claimant stores, the later ones add once it has landed
              // (its mark comes before its next barrier, see there).
              if ((kDet && det_need == 0) || (claims && claim_seen == 0)) {
                bulk_store(p.acc + at * (kChunkRows * 64), stage, S::kStageBytes);
                if (kClaims) claim_pending = at;
              } else {
                if (claims) await_turn(p.claims + at, kClaimStored, claim_seen);
                bulk_reduce_add_f32(p.acc + at * (kChunkRows * 64), stage, S::kStageBytes);
              }
            }
          }
        }
      }
    }
    // S^T_{t+1} ran under the staging. Nothing may stay in flight across the loop's back edge:
    // ptxas then serializes every wgmma of the kernel (C7514 / C7515).
    wgmma_wait<0>();
    cur = nxt;
  }
  if (kClaims && claim_pending >= 0) count_after_completion(p.claims + claim_pending, kClaimStored);
  fence_regs(dv);
  fence_regs(dk);

  if constexpr (!kSplit) {
    if (parts > 1) {
      // head_parts: this part's f32 share of dK (scaled) and dV, stored straight from the
      // accumulators (a lane quad writes whole 32-byte sectors); fa3_bwd_kv_post sums the parts.
      const int64_t rows = (int64_t{b} * gridDim.y + hk) * p.lk;
      float* const pk = p.kv_part + part * p.kv_part_stride;
      float* const pv = p.kv_part + (parts + part) * p.kv_part_stride;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (i == 0 ? past0 : past1) continue;
        const int64_t at = (rows + key0 + 8 * i) * D + cq;
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j) {
          *reinterpret_cast<float2*>(pv + at + j * 8) =
              make_float2(dv[4 * j + 2 * i], dv[4 * j + 2 * i + 1]);
          *reinterpret_cast<float2*>(pk + at + j * 8) =
              make_float2(dk[4 * j + 2 * i] * p.scale, dk[4 * j + 2 * i + 1] * p.scale);
        }
      }
      // The last dQ reduction (kDet: counted) as the staged path waits for it.
      if (threadIdx.x % 128 == 0) {
        if constexpr (kDet) {
          if (det_pending >= 0) count_after_completion(p.det_counts + det_pending);
        }
        bulk_wait<0, false>();
      } else {
        bulk_wait<0, true>();
      }
      return;
    }
  }
  // Epilogue: dV and scale * dK through shared memory, then one bulk copy a row (rows past Lk
  // skipped; zero where no query saw the key). Storing the accumulators straight to global memory
  // took 64 4-byte stores a thread (D = 128: 128) into half-used sectors, with every warp of the
  // CTA waiting on the store queue and then on the stores' drain at exit: about a tenth of the d64
  // L1024 kernel's warp time in ncu (H200). K, V and the Q / dY ring are free once every
  // warpgroup is past its last GEMM; each warpgroup stages its dV then its dK tile there, rows
  // padded by 16 bytes so that a store's 8 rows fall in distinct banks.
  constexpr int kPitch = kCols * 2 + 16, kOutTile = 64 * kPitch;
  static_assert(2 * W * kOutTile <= S::kDs, "the staged dK / dV must fit in K, V and the ring");
  sync_consumers<W>();
  {
    const uint32_t out_v = base + 2 * wg * kOutTile, out_k = out_v + kOutTile;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t row = static_cast<uint32_t>(wl * 16 + lane / 4 + 8 * i) * kPitch + cq * 2;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
        const uint32_t v = cuda::pack2<T>(dv[4 * j + 2 * i], dv[4 * j + 2 * i + 1]);
        const uint32_t k =
            cuda::pack2<T>(dk[4 * j + 2 * i] * p.scale, dk[4 * j + 2 * i + 1] * p.scale);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(out_v + row + j * 16), "r"(v) : "memory");
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(out_k + row + j * 16), "r"(k) : "memory");
      }
    }
    fence_proxy_async();
    sync_warpgroup<W>(wg);
    // Thread tid of the warpgroup copies row tid % 64 of its dV (tid < 64) or dK tile.
    const int tid = static_cast<int>(threadIdx.x) % 128, r = tid % 64, key = n0 + wg_key + r;
    if (key < lk) {
      const bool is_k = tid >= 64;
      const int64_t* sd = is_k ? p.sdk : p.sdv;
      T* dst = static_cast<T*>(is_k ? p.dk : p.dv) + sq_.tb * sd[0] + hk * sd[1] +
               (sq_.k0 + key) * sd[2] + (kSplit ? wg * kCols : 0);
      bulk_store(dst, (is_k ? out_k : out_v) + r * kPitch, kCols * 2);
    }
    // The last dQ reduction is waited for here, after the stores are issued, so that no warpgroup
    // waits for its L2 round trip at the barrier before the staging (its source, the dQ stage,
    // lies past the staged tiles). Every other thread only waits for its row's read: shared
    // memory may then be released. Waiting before the barrier cost 1.5-3.1% at L512 / L1024, d64
    // and d128, and nothing measurable from L2048 (H200, fifty-ninth session's call 2).
    if (!kSplit && tid == 0) {
      if constexpr (kDet) {
        if (det_pending >= 0) count_after_completion(p.det_counts + det_pending);
      }
      bulk_wait<0, false>();
    } else {
      bulk_wait<0, true>();
    }
  }
#endif  // BARACUDA_FA3_DEVICE
}

// ---- prep and post (plain CUDA: any arch the kernels above run on) -----------------------------
struct RowParams {
  const void* y;
  const void* dy;
  void* dq;
  const float* lse;
  float *lse2, *delta, *acc;
  int64_t sy[3], sdy[3], sdq[3], sl[3];  // (varlen: of the [1, H, T] views)
  const int* cu_q;                       // varlen: query sequence offsets (null: padded)
  int total_q;
  int lq, lq_pad, heads_q;
  float scale;
  unsigned* det_counts;  // kDet: the chunks' add counts, zeroed here (null otherwise)
  unsigned* det_ticket;
  int det_rotated;  // kDet: two accumulators and two sets of counts, each half of its buffer
  // det_rotated's post: which chunks a walk reached (see fa3_bwd_post). The key sequences (varlen:
  // cu_k, else null), the longest (the main grid's key blocks) and the query heads a key head.
  const int* cu_k;
  int total_k, lk, group;
  int head_parts;    // the main grid's split of each walk (BwdParams::head_parts): a part's walk
  unsigned* claims;  // not kDet: BwdParams::claims, zeroed here (null: the accumulator zeroed)
};

// Sequence b's query rows: packed rows [q0, q0 + lq) of tensor batch tb (the main kernel's rule).
struct RowSeq {
  int q0, lq, tb;
};
__device__ __forceinline__ RowSeq row_seq(const RowParams& p, int b) {
  if (!p.cu_q) return {0, p.lq, b};
  const SeqSpan s = seq_span(p.cu_q, b, p.lq, p.total_q);
  return {s.start, s.len, 0};
}

// A row of Y and dY is D / 8 lanes' 16-byte vectors (16-byte-aligned rows: cuda::check_tma_rows);
// each warp takes kRowsPerWarp consecutive rows, kRowsAtOnce of them at a time, with every load
// issued before the first sum, so that 2 * kSteps vectors a lane are in flight. Prep is a copy's
// worth of traffic (it reads Y and dY and writes the f32 accumulator's zeros, as many bytes again):
// one row a warp with one 4-byte load a lane ran it at 2.5 TB/s at D = 64 (110.8 us at L512), this
// at 4.0 (68.0 us; H200, ncu).
template <int D>
struct PrepShape {
  static constexpr int kLanesPerRow = D / 8;
  static constexpr int kRowsAtOnce = 32 / kLanesPerRow;
  static constexpr int kSteps = 4;
  static constexpr int kRowsPerWarp = kRowsAtOnce * kSteps;
  static constexpr int kRowsPerBlock = 8 * kRowsPerWarp;  // 256 threads (D = 64: 128 rows)
};

// Grid: lq_pad / kRowsPerBlock x Hq x B (lq_pad is a multiple of 128, so of every kRowsPerBlock).
// kDet: each block also zeroes its chunks' add counts (det_rotated: both sets, the second where
// its head is its part's first: second_chunk), and the first the ticket counter; no accumulator
// (see fa3_bwd_post).
template <class T, int D, bool kDet = false>
__global__ void __launch_bounds__(256) fa3_bwd_prep(const RowParams p) {
  using S = PrepShape<D>;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  // claims (not kDet): the chunks' claims zeroed as kDet's counts, and no accumulator. (D = 256
  // has neither: a block there covers half a chunk.)
  unsigned* const counts = kDet ? p.det_counts : p.claims;
  if constexpr (D <= 128) {
    if (kDet || counts) {
      constexpr int kCounts = S::kRowsPerBlock / kChunkRows * (D / 64);
      const int64_t c0 = ((int64_t{b} * p.heads_q + h) * (p.lq_pad / kChunkRows) +
                          int64_t{blockIdx.x} * (S::kRowsPerBlock / kChunkRows)) *
                         (D / 64);
      const int m_blk = static_cast<int>(blockIdx.x) * (S::kRowsPerBlock / kChunkRows);
      if (threadIdx.x < kCounts) {
        counts[c0 + threadIdx.x] = 0u;
        if (kDet && p.det_rotated && h % (p.group / p.head_parts) == 0)
          p.det_counts[acc_chunks<D>(p) + second_chunk<D>(p, part_of(p, b, h), m_blk, 0) +
                       threadIdx.x] = 0u;
      }
      if (kDet && blockIdx.x == 0 && h == 0 && b == 0 && threadIdx.x == 0) *p.det_ticket = 0u;
    }
  }
  const int first = static_cast<int>(blockIdx.x) * S::kRowsPerBlock + warp * S::kRowsPerWarp;
  const int sub = lane / S::kLanesPerRow, col = lane % S::kLanesPerRow;
  const RowSeq sq = row_seq(p, b);
  uint4 yv[S::kSteps], dyv[S::kSteps];
#pragma unroll
  for (int i = 0; i < S::kSteps; ++i) {
    const int row = first + i * S::kRowsAtOnce + sub;
    yv[i] = dyv[i] = make_uint4(0, 0, 0, 0);
    if (row < sq.lq) {
      const int64_t at = sq.q0 + row;  // the row in the tensors
      const T* y = static_cast<const T*>(p.y) + sq.tb * p.sy[0] + h * p.sy[1] + at * p.sy[2];
      const T* dy = static_cast<const T*>(p.dy) + sq.tb * p.sdy[0] + h * p.sdy[1] + at * p.sdy[2];
      yv[i] = reinterpret_cast<const uint4*>(y)[col];
      dyv[i] = reinterpret_cast<const uint4*>(dy)[col];
    }
  }
  // The accumulator (whatever its order inside a chunk) is B * Hq * lq_pad * D floats: this warp
  // zeroes its rows' piece, which is contiguous.
  const int64_t r0 = (int64_t{b} * p.heads_q + h) * p.lq_pad + first;
  // (kDet: none. A chunk's first adder stores, and post reads no chunk that nothing added into:
  // it takes the chunk's count, or the rotated walks' positions. Zeroing it here cost a write of
  // the whole f32 accumulator, which the adds' stores then replace.)
  if (!kDet && !p.claims) {
    float4* acc = reinterpret_cast<float4*>(p.acc + r0 * D);
#pragma unroll
    for (int j = 0; j < S::kRowsPerWarp * D / 4 / 32; ++j)
      acc[j * 32 + lane] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < S::kSteps; ++i) {
    const uint32_t* yw = reinterpret_cast<const uint32_t*>(&yv[i]);
    const uint32_t* dw = reinterpret_cast<const uint32_t*>(&dyv[i]);
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = cuda::unpack2<T>(yw[e]), c = cuda::unpack2<T>(dw[e]);
      dot = fmaf(a.x, c.x, fmaf(a.y, c.y, dot));
    }
#pragma unroll
    for (int o = S::kLanesPerRow / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const int row = first + i * S::kRowsAtOnce + sub;
    if (col == 0) {
      float l2 = INFINITY;  // past Lq, or a row that sees no key: every probability 0
      if (row < sq.lq) {
        const float l = p.lse[sq.tb * p.sl[0] + h * p.sl[1] + (sq.q0 + row) * p.sl[2]];
        if (l != -INFINITY) l2 = l * 1.4426950408889634f;
      }
      p.lse2[r0 + i * S::kRowsAtOnce + sub] = l2;
      p.delta[r0 + i * S::kRowsAtOnce + sub] = dot;
    }
  }
}

// One 128-thread block per accumulator chunk: (batch, query head, 64-row query block, 64-column
// part). Thread i holds the chunk's float4 j at j * 128 + i, which is accumulator-fragment order:
// rows 16 (i / 32) + (i % 32) / 4 (+ 8 for the float4's second pair), columns 8 j + 2 (i % 4)
// (+ 1). The part goes through shared memory as 16-bit rows so that dQ is written in whole
// 128-byte rows.
// kDet: prep zeroes no accumulator. Unrotated walks: a chunk with a count of 0 reads as 0.
// det_rotated: the sum of the accumulator's two halves (in that order): the first half holds every
// position of a sequence with keys (key block 0's walk starts at position 0), the second the
// positions before the highest key block's rotation, rot(g - 1) = (g - 1) nm / key_blocks (the
// walks that wrap past them; query blocks of the first head of each part's walk only,
// BwdParams::head_parts, a chunk row a part: second_chunk); a sequence without keys has dQ 0.
template <class T, int D, bool kDet = false>
__global__ void __launch_bounds__(128) fa3_bwd_post(const RowParams p) {
  constexpr int kParts = D / 64;
  // 64 rows of 32 words; a pitch of 36 words keeps both the fragment-order writes (lane l at bank
  // l) and the 16-byte row reads conflict-free.
  __shared__ alignas(16) uint32_t tile[kChunkRows][36];
  const int part = static_cast<int>(blockIdx.x) % kParts,
            m_blk = static_cast<int>(blockIdx.x) / kParts;
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32;
  const int64_t chunk =
      ((int64_t{b} * p.heads_q + h) * (p.lq_pad / kChunkRows) + m_blk) * kParts + part;
  const float4* src = reinterpret_cast<const float4*>(p.acc + chunk * (kChunkRows * 64));
  const int r0 = (tid / 32) * 16 + lane / 4;
  bool first = true, second = false;
  // A chunk nothing added into (rows that see no key: a bottom-right mask with Lq > Lk, a window,
  // a sequence without keys) holds whatever the workspace held.
  if (kDet && !p.det_rotated) first = p.det_counts[chunk] != 0u;
  if (!kDet && p.claims) first = p.claims[chunk] != 0u;
  if (kDet && p.det_rotated) {
    const RowSeq sq = row_seq(p, b);
    const int lk = p.cu_k ? seq_span(p.cu_k, b, p.lk, p.total_k).len : p.lk;
    const int g = (lk + kDetKeys - 1) / kDetKeys, nm = (sq.lq + kChunkRows - 1) / kChunkRows;
    const int64_t pos = int64_t{h % (p.group / p.head_parts)} * nm + m_blk;  // in its part's walk
    first = g > 0;
    second = g > 0 && pos < walk_start(g - 1, nm, (p.lk + kDetKeys - 1) / kDetKeys);
  }
  // (second: pos < nm, so h is its part's first head.)
  const float4* src2 =
      reinterpret_cast<const float4*>(p.acc) +
      (kDet && second ? (acc_chunks<D>(p) + second_chunk<D>(p, part_of(p, b, h), m_blk, part)) *
                            (kChunkRows * 16)
                      : 0);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float4 v = first ? src[staged_slot(j, tid)] : make_float4(0.f, 0.f, 0.f, 0.f);
    if (kDet && p.det_rotated && second) {
      const float4 w = src2[staged_slot(j, tid)];
      v = make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
    }
    tile[r0][4 * j + lane % 4] = cuda::pack2<T>(v.x * p.scale, v.y * p.scale);
    tile[r0 + 8][4 * j + lane % 4] = cuda::pack2<T>(v.z * p.scale, v.w * p.scale);
  }
  __syncthreads();
  const RowSeq sq = row_seq(p, b);
  // 64 rows x 8 chunks of 16 bytes (4 words each).
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int idx = it * 128 + tid, r = idx / 8, c = idx % 8;
    const int row = m_blk * kChunkRows + r;
    if (row >= sq.lq) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(&tile[r][4 * c]);
    T* dq = static_cast<T*>(p.dq) + sq.tb * p.sdq[0] + h * p.sdq[1] + (sq.q0 + row) * p.sdq[2] +
            part * 64 + c * 8;
    *reinterpret_cast<uint4*>(dq) = v;
  }
}

// head_parts' sum (BwdParams::head_parts): dK and dV, each element the parts' f32 shares added in
// part order (the bits do not depend on which part finished first) and rounded once. A thread
// takes 8 columns (16 bytes out) of a row of dK and of dV.
struct KvPostParams {
  const float* part;  // [2][parts][B][Hk][Lk][D]: dK's shares, then dV's
  int64_t part_stride;
  int parts;
  void *dk, *dv;
  int64_t sdk[3], sdv[3];
  int lk, heads_k;
};
template <class T, int D>
__global__ void __launch_bounds__(256) fa3_bwd_kv_post(const KvPostParams p) {
  constexpr int kPieces = D / 8, kRows = 256 / kPieces;
  const int piece = static_cast<int>(threadIdx.x) % kPieces,
            r = static_cast<int>(blockIdx.x) * kRows + static_cast<int>(threadIdx.x) / kPieces;
  const int hk = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  if (r >= p.lk) return;
  const int64_t at = ((int64_t{b} * p.heads_k + hk) * p.lk + r) * D + piece * 8;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    float sum[8] = {};
    for (int q = 0; q < p.parts; ++q) {
      const float4* src =
          reinterpret_cast<const float4*>(p.part + (which * p.parts + q) * p.part_stride + at);
      const float4 lo = src[0], hi = src[1];
      sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
      sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
    }
    const uint4 out = make_uint4(cuda::pack2<T>(sum[0], sum[1]), cuda::pack2<T>(sum[2], sum[3]),
                                 cuda::pack2<T>(sum[4], sum[5]), cuda::pack2<T>(sum[6], sum[7]));
    const int64_t* sd = which ? p.sdv : p.sdk;
    T* dst = static_cast<T*>(which ? p.dv : p.dk) + b * sd[0] + hk * sd[1] + r * sd[2] + piece * 8;
    *reinterpret_cast<uint4*>(dst) = out;
  }
}

// ---- host ---------------------------------------------------------------------------------------
constexpr std::string_view kWho = "attention_backward: fa3_bwd_sm90a";

// The workspace's rows per (sequence, query head): whole steps of every instance (q128's 128
// rows), so that a step's lse2 / delta load stays inside them.
inline int64_t padded_rows(const Problem& pr) {
  constexpr int64_t kPad = BwdShape<64, 2, 128>::kQRows;
  return (pr.desc.len_q + kPad - 1) / kPad * kPad;
}

// fa3_bwd_sm90a_deterministic rotates the walks of unmasked problems (see the kernel), with two
// accumulators and two sets of counts.
// The kernel's rule for a step's predecessors there is 32-bit: (a walk's steps) x (key blocks)
// below 2^31, which any workspace that fits a GPU keeps.
inline bool det_rotates(const Problem& pr) {
  const auto& d = pr.desc;
  const int64_t steps = (d.len_q + kChunkRows - 1) / kChunkRows * pr.group,
                blocks = (d.len_k + kDetKeys - 1) / kDetKeys;
  return band_bound(d.mask.left, d) < 0 && band_bound(d.mask.right, d) < 0 &&
         steps * blocks < (int64_t{1} << 31);
}

// Workspace: the f32 dQ accumulator, then lse2 and delta, each 256-byte aligned from the first
// 256-byte boundary of the caller's buffer (256 bytes of slack are asked for).
// Then the chunks' add counts (kDet) or claims (BwdParams::claims; one int a 64-row, 64-column
// chunk) and, kDet, the ticket counter; where kDet's walks rotate, the accumulator and the counts
// twice over.
// head_parts > 1: then dK's and dV's f32 shares (KvPostParams::part).
struct Layout {
  size_t acc = 0, lse2 = 0, delta = 0, counts = 0, det_ticket = 0, kv_part = 0, bytes = 0;
};
inline size_t kv_part_floats(const Problem& pr) {
  const auto& d = pr.desc;
  return static_cast<size_t>(d.batch * d.heads_kv * d.len_k * d.head_dim_qk);
}
inline Layout layout_of(const Problem& pr, bool det = false, int head_parts = 1) {
  const auto& d = pr.desc;
  const size_t rows = static_cast<size_t>(d.batch * d.heads_q * padded_rows(pr));
  // The deterministic rotated walks' second half: a part's first head's rows only (second_chunk).
  const size_t second_rows =
      det && det_rotates(pr) ? rows / static_cast<size_t>(pr.group / head_parts) : 0;
  const size_t acc_rows = rows + second_rows;
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  Layout l;
  l.acc = 0;
  l.lse2 = up(acc_rows * static_cast<size_t>(d.head_dim_qk) * 4);
  l.delta = l.lse2 + up(rows * 4);
  l.counts = l.delta + up(rows * 4);
  l.det_ticket = l.counts + up(acc_rows / kChunkRows * (d.head_dim_qk / 64) * 4);
  l.kv_part = l.det_ticket + (det ? 256 : 0);
  const size_t kv = head_parts > 1 ? 2 * static_cast<size_t>(head_parts) * kv_part_floats(pr) : 0;
  l.bytes = l.kv_part + up(kv * 4) + 256;
  return l;
}

template <class T>
bool fits(const Problem& pr, const DeviceCaps& caps) {
  if (caps.device < 0 || caps.sm != 90 || !shape_fits(pr) ||
      pr.desc.head_dim_qk != pr.desc.head_dim_v ||
      (pr.desc.head_dim_qk != 64 && pr.desc.head_dim_qk != 128 && pr.desc.head_dim_qk != 256))
    return false;
  // A CTA's steps (query blocks x the group's query heads) and their rotated index (t + rot <
  // 2 steps) are ints; the grid's y / z carry key heads and batch (shape_fits bounds them).
  if (padded_rows(pr) / kChunkRows * pr.group >= (int64_t{1} << 30)) return false;
  switch (pr.desc.head_dim_qk) {
    case 64:
      return has_sm90a_body<fa3_bwd_kernel<T, 64, false, false>>();
    case 128:
      return has_sm90a_body<fa3_bwd_kernel<T, 128, false, false>>();
    default:
      return has_sm90a_body<fa3_bwd_kernel<T, 256, false, false>>();
  }
}

inline size_t workspace(const Problem& pr, const DeviceCaps&) {
  return layout_of(pr).bytes;
}
inline size_t workspace_det(const Problem& pr, const DeviceCaps&) {
  return layout_of(pr, true).bytes;
}

// The TMA loads' and vector stores' layout rules (cuda::check_tma_rows) on the run's views: the
// registry's check, so that can_implement refuses what launch could not load.
inline Status check_args(const Problem& pr, const BackwardArguments& a) {
  const bool vl = pr.desc.varlen;
  const std::pair<const char*, ConstTensor> views[] = {{"q", rows_view(a.q, vl)},
                                                       {"k", rows_view(a.k, vl)},
                                                       {"v", rows_view(a.v, vl)},
                                                       {"y", rows_view(a.y, vl)},
                                                       {"dy", rows_view(a.dy, vl)},
                                                       {"dq", as_const(rows_view(a.dq, vl))},
                                                       {"dk", as_const(rows_view(a.dk, vl))},
                                                       {"dv", as_const(rows_view(a.dv, vl))}};
  for (const auto& [name, t] : views) BARACUDA_TRY(cuda::check_tma_rows(kWho, name, t));
  return {};
}

// The grid's order and split (BwdParams::heavy_first, head_parts): the ranked entry splits, the
// by-name instances below take either or both.
struct Schedule {
  bool heavy_first = false, head_split = false;
  int parts = 0;  // > 0 (head_split): that many parts, by name for measurement; 0: the model's
  bool model_order = false;  // heavy_first where the model says (fa3_bwd_grid; the ranked entry)
  // Not kDet, with heavy_first: walks query block major from the last (BwdParams::falling_walks),
  // the best split of the grid taken key block first (Fa3BwdGrid::split_heavy_first).
  bool falling = false;
  // Where claims fit (kClaimsFit, walks not falling): up to fa3_bwd_first_store's rows; never
  // (the accumulator zeroed by prep and every dQ add a reduce-add: fa3_bwd_sm90a_ranked_zeroed, the
  // ranked entry as it ran before BwdParams::claims); or at every length
  // (fa3_bwd_sm90a_ranked_claims). Both by name for measurement.
  enum class Claims { bounded, never, always } claims = Claims::bounded;
};
// The parts a non-deterministic schedule splits each walk into under the grid model: the launch
// and its workspace both ask here, so they agree.
constexpr int scheduled_parts(const Fa3BwdGrid& model, const Schedule& s) {
  return s.parts > 0     ? s.parts
         : s.model_order ? model.parts
         : s.falling     ? model.split_heavy_first
                         : model.split;
}
// The ranked-ahead entry's two schedules: fa3_bwd_sm90a_falling's walks where kFa3BwdFallingPicks
// says, else the model's order and split.
inline constexpr Schedule kFallingSchedule{
    .heavy_first = true, .head_split = true, .falling = true};
inline constexpr Schedule kRankedSchedule{.head_split = true, .model_order = true};
template <class T, int D, int W = 2, int Q = 64, bool kDet = false>
Status launch_d(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a,
                Schedule sched = {}) {
  const auto& d = pr.desc;
  if (!has_sm90a_body<fa3_bwd_kernel<T, D, false, false, W, Q, kDet>>())
    return Error::unsupported(std::string(kWho) + ": this build has no sm_90a code for the kernel");
  const bool vl = d.varlen;
  const ConstTensor q = rows_view(a.q, vl), k = rows_view(a.k, vl), v = rows_view(a.v, vl),
                    y = rows_view(a.y, vl), dy = rows_view(a.dy, vl), lse = lse_view(a.lse, vl);
  const Tensor dq = rows_view(a.dq, vl), dk = rows_view(a.dk, vl), dv = rows_view(a.dv, vl);
  constexpr int kKeys = BwdShape<D, W, Q>::kKeys, kQRows = BwdShape<D, W, Q>::kQRows;
  // (kDet splits too, by its own model: fa3_bwd_det_parts; its order stays the tickets'.)
  const bool splits = sched.head_split && !BwdShape<D, W, Q>::kSplitCols;
  const DeviceCaps& caps = ctx.stream.caps();
  const Fa3BwdGrid model = splits && !kDet
                               ? fa3_bwd_grid(pr, caps.sm_count, kKeys, kQRows, caps.l2_bytes)
                               : Fa3BwdGrid{};
  const int parts = !splits           ? 1
                    : sched.parts > 0 ? sched.parts
                    : kDet ? fa3_bwd_det_parts(pr, caps.sm_count, kKeys, kQRows, det_rotates(pr),
                                               sched.heavy_first)
                           : scheduled_parts(model, sched);
  const bool heavy_first = sched.heavy_first || (sched.model_order && model.heavy_first);
  const Layout lay = layout_of(pr, kDet, parts);
  if (ctx.workspace.bytes < lay.bytes)
    return Error::workspace_too_small(std::string(kWho) + ": workspace", lay.bytes,
                                      ctx.workspace.bytes);
  const CUtensorMapDataType dt = cuda::tensor_map_dtype<T>();
  CUtensorMap tq, tk, tv, tdy;
  BARACUDA_TRY(cuda::make_rows_map(kWho, &tq, dt, q, kQRows));
  BARACUDA_TRY(cuda::make_rows_map(kWho, &tk, dt, k, kKeys));
  BARACUDA_TRY(cuda::make_rows_map(kWho, &tv, dt, v, kKeys));
  BARACUDA_TRY(cuda::make_rows_map(kWho, &tdy, dt, dy, kQRows));

  char* ws = static_cast<char*>(ctx.workspace.data) +
             (256 - reinterpret_cast<uintptr_t>(ctx.workspace.data) % 256) % 256;
  RowParams rp{};
  rp.y = y.data;
  rp.dy = dy.data;
  rp.dq = dq.data;
  rp.lse = static_cast<const float*>(lse.data);
  rp.acc = reinterpret_cast<float*>(ws + lay.acc);
  rp.lse2 = reinterpret_cast<float*>(ws + lay.lse2);
  rp.delta = reinterpret_cast<float*>(ws + lay.delta);
  outer_strides(rp.sy, y);
  outer_strides(rp.sdy, dy);
  outer_strides(rp.sdq, dq);
  outer_strides(rp.sl, lse);
  if (vl) {
    rp.cu_q = static_cast<const int*>(a.cu_seqlens_q.data);
    rp.total_q = static_cast<int>(d.total_q);
  }
  rp.lq = static_cast<int>(d.len_q);
  rp.lq_pad = static_cast<int>(padded_rows(pr));
  rp.heads_q = static_cast<int>(d.heads_q);
  rp.scale = static_cast<float>(pr.scale);
  if (kDet) {
    rp.det_counts = reinterpret_cast<unsigned*>(ws + lay.counts);
    rp.det_ticket = reinterpret_cast<unsigned*>(ws + lay.det_ticket);
    rp.det_rotated = det_rotates(pr) ? 1 : 0;
    rp.cu_k = vl ? static_cast<const int*>(a.cu_seqlens_k.data) : nullptr;
    rp.total_k = vl ? static_cast<int>(d.total_k) : 0;
    rp.lk = static_cast<int>(d.len_k);
    rp.group = static_cast<int>(pr.group);
    rp.head_parts = parts;
  }

  BwdParams p{};
  p.dk = dk.data;
  p.dv = dv.data;
  p.acc = rp.acc;
  p.lse2 = rp.lse2;
  p.delta = rp.delta;
  outer_strides(p.sdk, dk);
  outer_strides(p.sdv, dv);
  set_common_params(p, pr, a.cu_seqlens_q, a.cu_seqlens_k);
  p.lq = rp.lq;
  p.lk = static_cast<int>(d.len_k);
  p.lq_pad = rp.lq_pad;
  p.group = static_cast<int>(pr.group);
  p.heads_q = rp.heads_q;
  p.scale = rp.scale;
  p.det_counts = rp.det_counts;
  p.det_ticket = rp.det_ticket;
  p.det_rotated = rp.det_rotated;
  // (kDet: heavy_first is the rising order, its walks falling, for unrotated walks only.)
  p.heavy_first = heavy_first && !(kDet && rp.det_rotated) ? 1 : 0;
  p.falling_walks = kDet ? p.heavy_first : sched.falling && heavy_first ? 1 : 0;
  // Not where the walks fall: every key block of a head would claim the step's chunk at once, and
  // all but one wait for its mark. Nor past fa3_bwd_first_store's rows (slower there).
  using Claims = Schedule::Claims;
  if (kClaimsFit<D, W, Q, kDet> && !p.falling_walks &&
      (sched.claims == Claims::always ||
       (sched.claims == Claims::bounded && fa3_bwd_first_store(pr))))
    rp.claims = p.claims = reinterpret_cast<unsigned*>(ws + lay.counts);
  p.head_parts = parts;
  p.kv_part = parts > 1 ? reinterpret_cast<float*>(ws + lay.kv_part) : nullptr;
  p.kv_part_stride = static_cast<int64_t>(kv_part_floats(pr));

  constexpr int smem = BwdSmem<D, W, Q>::kLaunchBytes;
  // Soft-capping and varlen in instantiations of their own (see the kernel). The D = 64 instances
  // (W = 3, Q = 128) have no soft-capped ones (launch_d64 refuses the cap).
  constexpr bool kCaps = W == 2 && Q == 64;
  constexpr std::array kernels = {fa3_bwd_kernel<T, D, false, false, W, Q, kDet>,
                                  fa3_bwd_kernel<T, D, kCaps, false, W, Q, kDet>,
                                  fa3_bwd_kernel<T, D, false, true, W, Q, kDet>,
                                  fa3_bwd_kernel<T, D, kCaps, true, W, Q, kDet>};
  const auto kernel = kernels[(p.softcap ? 1 : 0) + (vl ? 2 : 0)];
  const cudaStream_t st = cuda::stream_of(ctx);
  const dim3 rows_grid(static_cast<unsigned>(rp.lq_pad / PrepShape<D>::kRowsPerBlock),
                       static_cast<unsigned>(d.heads_q), static_cast<unsigned>(d.batch));
  fa3_bwd_prep<T, D, kDet><<<rows_grid, 256, 0, st>>>(rp);
  BARACUDA_TRY(cuda::check_launch(attention::BackwardOp::name, "fa3_bwd_sm90a prep"));
  const dim3 grid(static_cast<unsigned>((d.len_k + kKeys - 1) / kKeys * parts),
                  static_cast<unsigned>(d.heads_kv), static_cast<unsigned>(d.batch));
  BARACUDA_TRY(cuda::launch_with_smem(attention::BackwardOp::name, "fa3_bwd_sm90a", kernel, grid,
                                      BwdShape<D, W, Q>::kThreads, smem, st, tq, tk, tv, tdy, p));
  if (parts > 1) {
    KvPostParams kp{};
    kp.part = p.kv_part;
    kp.part_stride = p.kv_part_stride;
    kp.parts = parts;
    kp.dk = dk.data;
    kp.dv = dv.data;
    outer_strides(kp.sdk, dk);
    outer_strides(kp.sdv, dv);
    kp.lk = p.lk;
    kp.heads_k = static_cast<int>(d.heads_kv);
    constexpr int kRows = 256 / (D / 8);
    const dim3 kv_grid(static_cast<unsigned>((d.len_k + kRows - 1) / kRows),
                       static_cast<unsigned>(d.heads_kv), static_cast<unsigned>(d.batch));
    fa3_bwd_kv_post<T, D><<<kv_grid, 256, 0, st>>>(kp);
    BARACUDA_TRY(cuda::check_launch(attention::BackwardOp::name, "fa3_bwd_sm90a kv post"));
  }
  const dim3 post_grid(static_cast<unsigned>(rp.lq_pad / kChunkRows * (D / 64)),
                       static_cast<unsigned>(d.heads_q), static_cast<unsigned>(d.batch));
  fa3_bwd_post<T, D, kDet><<<post_grid, 128, 0, st>>>(rp);
  return cuda::check_launch(attention::BackwardOp::name, "fa3_bwd_sm90a post");
}

// fa3_bwd_sm90a's instance of the head dim (64-row steps), under a schedule (the plain entry's:
// none).
template <class T, Schedule kSched = Schedule{}>
Status launch(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  switch (pr.desc.head_dim_qk) {
    case 64:
      return launch_d<T, 64>(ctx, pr, a, kSched);
    case 128:
      return launch_d<T, 128>(ctx, pr, a, kSched);
    default:
      return launch_d<T, 256>(ctx, pr, a, kSched);
  }
}

// The D = 64 instances: three warpgroups over 192 keys a CTA (W = 3, fa3_bwd_sm90a_k192), or 128
// query rows a step (Q = 128, fa3_bwd_sm90a_q128, FlashAttention-3's d64 tile; the ranked-ahead
// entry's kernel where fa3_bwd_widens). D = 64 without soft-capping alone (k192's wgmmas serialize
// in 168 registers with soft-capping's extra tile; neither has capped instances).
template <int W, int Q>
constexpr std::string_view kD64Name = W == 3 ? kFa3BwdK192Kernel : kFa3BwdQ128Kernel;
template <class T, int W, int Q>
bool fits_d64(const Problem& pr, const DeviceCaps& caps) {
  return pr.desc.head_dim_qk == 64 && pr.desc.softcap <= 0 && fits<T>(pr, caps) &&
         has_sm90a_body<fa3_bwd_kernel<T, 64, false, false, W, Q>>();
}
template <class T, int W, int Q>
Status launch_d64(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  const std::string who =
      std::string(attention::BackwardOp::name) + ": " + std::string(kD64Name<W, Q>);
  if (pr.desc.softcap > 0)
    return Error::unsupported(who + ": softcap: not served (use fa3_bwd_sm90a)");
  if (pr.desc.head_dim_qk != 64)
    return Error::unsupported(who + ": head_dim=" + std::to_string(pr.desc.head_dim_qk) +
                              ": D = 64 only");
  return launch_d<T, 64, W, Q>(ctx, pr, a);
}

// fa3_bwd_sm90a_deterministic: D = 64 and 128, everything fa3_bwd_sm90a takes there.
template <class T>
bool fits_det(const Problem& pr, const DeviceCaps& caps) {
  const int64_t dim = pr.desc.head_dim_qk;
  return (dim == 64 || dim == 128) && fits<T>(pr, caps) &&
         has_sm90a_body<fa3_bwd_kernel<T, 64, false, false, 2, 64, true>>();
}
// Where its entries below may fit: the table picks fa3 or cuDNN here (their rows were measured
// against whichever it picks; never over the family's kernels).
template <class T>
bool fits_det_over_table(const Problem& pr, const DeviceCaps& caps) {
  return fits_det<T>(pr, caps) && candidate_here(pr, Pass::backward, caps) != Candidate::bespoke;
}
// Its ranked entry: where it leads cuDNN's deterministic algorithm (fa3's ranked-ahead entry or
// cuDNN's, above it, fits there too).
template <class T>
bool fits_det_ranked(const Problem& pr, const DeviceCaps& caps) {
  return fa3_det_leads(pr) && fits_det_over_table<T>(pr, caps);
}
// fa3_bwd_sm90a_deterministic, and under a head split its _head_split instance (a key block's parts
// after every part of the higher key blocks in ticket order, by name).
template <class T, Schedule kSched = Schedule{}>
Status launch_det(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  if (pr.desc.head_dim_qk == 64) return launch_d<T, 64, 2, 64, true>(ctx, pr, a, kSched);
  if (pr.desc.head_dim_qk == 128) return launch_d<T, 128, 2, 64, true>(ctx, pr, a, kSched);
  const std::string_view name = kSched.heavy_first  ? kFa3BwdDeterministicHeavyFirstKernel
                                : kSched.head_split ? kFa3BwdDeterministicHeadSplitKernel
                                                    : kFa3BwdDeterministicKernel;
  return Error::unsupported(std::string(attention::BackwardOp::name) + ": " + std::string(name) +
                            ": head_dim=" + std::to_string(pr.desc.head_dim_qk) +
                            ": D = 64 or 128 only");
}
inline size_t det_split_bytes(const Problem& pr, const DeviceCaps& caps, bool rising) {
  const int parts = fa3_bwd_det_parts(pr, caps.sm_count, kDetKeys, 64, det_rotates(pr), rising);
  return layout_of(pr, true, parts).bytes;
}
template <bool kRising = false>
size_t workspace_det_split(const Problem& pr, const DeviceCaps& caps) {
  return det_split_bytes(pr, caps, kRising);
}
// The ranked deterministic entry: the split in its rising order where kFa3DetRising says, else
// falling.
inline size_t workspace_det_ranked(const Problem& pr, const DeviceCaps& caps) {
  return det_split_bytes(pr, caps, fa3_det_rising(pr));
}
template <class T>
Status launch_det_ranked(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  if (fa3_det_rising(pr))
    return launch_det<T, Schedule{.heavy_first = true, .head_split = true}>(ctx, pr, a);
  return launch_det<T, Schedule{.head_split = true}>(ctx, pr, a);
}

// Its default entry: where kFa3BwdDeterministicPicks says.
template <class T>
bool fits_det_default(const Problem& pr, const DeviceCaps& caps) {
  return fa3_bwd_deterministic_default(pr) && fits_det_over_table<T>(pr, caps);
}

// The kernels by name, in the order of their (falling) priorities in register_one.
struct Instance {
  std::string_view name;
  bool (*fits)(const Problem&, const DeviceCaps&);
  Status (*launch)(const LaunchContext&, const Problem&, const BackwardArguments&);
};
template <class T>
constexpr Instance kInstances[] = {{kFa3BwdKernel, fits<T>, launch<T>},
                                   {kD64Name<3, 64>, fits_d64<T, 3, 64>, launch_d64<T, 3, 64>},
                                   {kD64Name<2, 128>, fits_d64<T, 2, 128>, launch_d64<T, 2, 128>}};

// The ranked-ahead entry: fa3_ranked_backward_kernel's kernel, only where the measured table picks
// fa3 for the backward (among the candidates that serve the problem here: candidate_here).
// The kernel is picked by its name, as the forward's with_ranked_variant does: the name the bench
// pins for the table's column is the one that launches.
template <class T>
const Instance& ranked_instance(const Problem& pr) {
  const std::string_view name = fa3_ranked_backward_kernel(pr);
  for (const Instance& i : kInstances<T>)
    if (i.name == name) return i;
  return kInstances<T>[0];
}
template <class T>
bool fits_ranked_ahead(const Problem& pr, const DeviceCaps& caps) {
  return ranked_instance<T>(pr).fits(pr, caps) &&
         candidate_here(pr, Pass::backward, caps) == Candidate::fa3;
}
// The ranked instance under a schedule (fa3_bwd_sm90a_heavy_first, fa3_bwd_sm90a_head_split, both,
// and the ranked entry's split): the same kernels, the grid taken key block first or split.
template <class T>
bool fits_scheduled(const Problem& pr, const DeviceCaps& caps) {
  return ranked_instance<T>(pr).fits(pr, caps);
}
template <class T, Schedule kSched>
Status launch_scheduled(const LaunchContext& ctx, const Problem& pr, const BackwardArguments& a) {
  if (fa3_ranked_backward_kernel(pr) == kFa3BwdQ128Kernel)
    return launch_d<T, 64, 2, 128>(ctx, pr, a, kSched);
  return launch<T, kSched>(ctx, pr, a);
}
// Its workspace: the f32 shares where the schedule splits the grid (scheduled_parts).
template <Schedule kSched>
size_t workspace_scheduled(const Problem& pr, const DeviceCaps& caps) {
  // (Every instance head_parts splits takes 128 keys a CTA.)
  const int q_rows = fa3_ranked_backward_kernel(pr) == kFa3BwdQ128Kernel ? 128 : 64;
  const Fa3BwdGrid grid = fa3_bwd_grid(pr, caps.sm_count, 128, q_rows, caps.l2_bytes);
  return layout_of(pr, false, scheduled_parts(grid, kSched)).bytes;
}
// fa3_bwd_sm90a_head_split_x<P>: P parts whatever the model says (where P divides the group; D = 64
// / 128, padded), so that one bench run times every split at each point.
template <class T, int P>
bool fits_parts(const Problem& pr, const DeviceCaps& caps) {
  return pr.group % P == 0 && pr.desc.head_dim_qk <= 128 && !pr.desc.varlen &&
         fits_scheduled<T>(pr, caps);
}
template <int P>
size_t workspace_parts(const Problem& pr, const DeviceCaps&) {
  return layout_of(pr, false, P).bytes;
}
// The ranked-ahead entry launches the ranked instance with its walks split, and its grid taken key
// block first, where fa3_bwd_grid says (1.01-1.31x cuDNN in GQA groups where cuDNN led the unsplit
// kernel, see kGroupedBackwardPicks; heavy first 1.11-1.42x the split alone where it is taken);
// with fa3_bwd_sm90a_falling's walks where kFa3BwdFallingPicks says.
// kClaims other than bounded: fa3_bwd_sm90a_ranked_zeroed / _claims, the same launch with the
// accumulator zeroed by prep / with claims at every length (Schedule::claims), by name.
constexpr Schedule with_claims(Schedule s, Schedule::Claims claims) {
  s.claims = claims;
  return s;
}
template <class T, Schedule::Claims kClaims = Schedule::Claims::bounded>
Status launch_ranked_ahead(const LaunchContext& ctx, const Problem& pr,
                           const BackwardArguments& a) {
  if (fa3_bwd_falls(pr))
    return launch_scheduled<T, with_claims(kFallingSchedule, kClaims)>(ctx, pr, a);
  return launch_scheduled<T, with_claims(kRankedSchedule, kClaims)>(ctx, pr, a);
}
inline size_t workspace_ranked_ahead(const Problem& pr, const DeviceCaps& caps) {
  if (fa3_bwd_falls(pr)) return workspace_scheduled<kFallingSchedule>(pr, caps);
  return workspace_scheduled<kRankedSchedule>(pr, caps);
}

// One table of entries per element type. Not deterministic: dQ is summed by bulk reduce-adds in
// L2 in arrival order.
template <DType E>
bool register_one() {
  using T = cuda::device_t<E>;
  auto add = [](std::string_view name, int priority, bool deterministic, auto fits_fn,
                auto workspace_fn, auto launch_fn) {
    register_kernel<attention::BackwardOp>(
        {.sku = fa3_sku(attention::BackwardOp::name, E, fa3_precision(E, deterministic), name),
         .priority = priority,
         .fits = fits_fn,
         .workspace = workspace_fn,
         .launch = launch_fn,
         .check = check_args});
  };
  // Pinnable below the family's kernels and every cuDNN entry (-2, -3, ...): they never win
  // `fastest` on their own; PlanPreference::kernel(name) reaches each where it fits.
  int priority = -2;
  for (const Instance& i : kInstances<T>)
    add(i.name, priority--, false, i.fits, workspace, i.launch);
  // The deterministic instance, by name (its place among the deterministic entries is measured
  // first: docs/perf/attention_hopper.md, seventy-fourth session).
  add(kFa3BwdDeterministicKernel, priority--, true, fits_det<T>, workspace_det, launch_det<T>);
  add(kFa3BwdDeterministicHeadSplitKernel, priority--, true, fits_det<T>, workspace_det_split<>,
      launch_det<T, Schedule{.head_split = true}>);
  add(kFa3BwdDeterministicHeavyFirstKernel, priority--, true, fits_det<T>,
      workspace_det_split<true>, launch_det<T, Schedule{.heavy_first = true, .head_split = true}>);
  // The ranked instance with its grid key block first, split over the group's heads, or both, by
  // name (for measurement; the ranked entry below splits).
  add(kFa3BwdHeavyFirstKernel, priority--, false, fits_scheduled<T>, workspace,
      launch_scheduled<T, Schedule{.heavy_first = true}>);
  constexpr Schedule kSplit{.head_split = true},
      kSplitHeavyFirst{.heavy_first = true, .head_split = true};
  add(kFa3BwdHeadSplitKernel, priority--, false, fits_scheduled<T>, workspace_scheduled<kSplit>,
      launch_scheduled<T, kSplit>);
  add(kFa3BwdHeadSplitHeavyFirstKernel, priority--, false, fits_scheduled<T>,
      workspace_scheduled<kSplitHeavyFirst>, launch_scheduled<T, kSplitHeavyFirst>);
  add(kFa3BwdFallingKernel, priority--, false, fits_scheduled<T>,
      workspace_scheduled<kFallingSchedule>, launch_scheduled<T, kFallingSchedule>);
  add(kFa3BwdHeadSplitPartsKernels[0], priority--, false, fits_parts<T, 2>, workspace_parts<2>,
      launch_scheduled<T, Schedule{.head_split = true, .parts = 2}>);
  add(kFa3BwdHeadSplitPartsKernels[1], priority--, false, fits_parts<T, 4>, workspace_parts<4>,
      launch_scheduled<T, Schedule{.head_split = true, .parts = 4}>);
  add(kFa3BwdHeadSplitPartsKernels[2], priority--, false, fits_parts<T, 8>, workspace_parts<8>,
      launch_scheduled<T, Schedule{.head_split = true, .parts = 8}>);
  // The ranked entry's launch wherever its instance fits, and the same with the accumulator zeroed
  // (no claims) or with claims at every length, by name for measurement.
  add(kFa3BwdRankedKernel, priority--, false, fits_scheduled<T>, workspace_ranked_ahead,
      launch_ranked_ahead<T>);
  add(kFa3BwdRankedZeroedKernel, priority--, false, fits_scheduled<T>, workspace_ranked_ahead,
      launch_ranked_ahead<T, Schedule::Claims::never>);
  add(kFa3BwdRankedClaimsKernel, priority--, false, fits_scheduled<T>, workspace_ranked_ahead,
      launch_ranked_ahead<T, Schedule::Claims::always>);
  // The deterministic instance for PlanPreference::deterministic() where it leads (see
  // kFa3BwdDeterministicRanked), its walks split where the grid model says (as by name above: at
  // or above the unsplit instance's speed at every point measured), in the rising order where
  // kFa3DetRising says.
  add(kFa3BwdDeterministicRanked, kFa3DetAhead, true, fits_det_ranked<T>, workspace_det_ranked,
      launch_det_ranked<T>);
  // The same where its rising order ran ahead of the ranked entry (kFa3BwdDeterministicPicks):
  // above it, so the default backward there is deterministic.
  add(kFa3BwdDeterministicAhead, kFa3DetDefaultAhead, true, fits_det_default<T>,
      workspace_det_ranked, launch_det_ranked<T>);
  // fa3_ranked_backward_kernel's kernel above every other backward kernel but the deterministic
  // default entry above, fitting only where the measured selection table says fa3 is the fastest
  // candidate (cuDNN's non-deterministic entry then ranks behind).
  add(kFa3BwdRankedAhead, kFa3Ahead, false, fits_ranked_ahead<T>, workspace_ranked_ahead,
      launch_ranked_ahead<T>);
  return true;
}

}  // namespace
}  // namespace baracuda::attention_hopper::fa3

// Hopper-class backends of the attention family (issue 8): cuDNN's fused SDPA for forward and
// backward, registered into attention::ForwardOp / attention::BackwardOp's kernel tables, so users
// reach them through attention::ForwardPlan / BackwardPlan (PlanPreference::only(Backend::cudnn)
// forces them). cuDNN reads packed sequences (varlen) in its ragged layout under a padding mask,
// forward and backward; its backward there takes dense [T, H, D] tensors (each refused otherwise,
// naming the tensor and its strides) and head dims up to 128, the limits where it was measured
// right (H200, cuDNN 9.19).
//
// Also our own sm_90a forward and backward, fa3_fwd_sm90a / fa3_bwd_sm90a (FlashAttention-3
// style), registered the same way. What they take (on sm_90, bf16 / f16, 16-byte aligned rows and
// strides): GQA / MQA, any band mask (causal, sliding windows, either diagonal), logit
// soft-capping, padded or varlen (packed) sequences. Head dims: the forward Dk = Dv in
// {64, 128, 256} and DeepSeek MLA's Dk = 192 with Dv = 128; the backward Dk = Dv in {64, 128, 256}.
// Other problems go to cuDNN or the family's kernels.
//
// This header exposes the host-side rules those kernels follow, so callers (and tests) can ask why
// a problem does or does not go to cuDNN and which candidate the measured selection table prefers.
#pragma once

#include <array>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "baracuda/core/plan.hpp"
#include "baracuda/ops/attention.hpp"

namespace baracuda::attention_hopper {

// Why cuDNN's fused SDPA cannot take this problem, or nullopt when it may. These are the rules we
// know before asking cuDNN; on a GPU, select() then builds the cuDNN graph and cuDNN's own support
// check has the final word (a graph cuDNN refuses makes the kernel not fit, never an error).
std::optional<std::string> cudnn_screen(const attention::Problem& p);

enum class Pass : uint8_t { forward, backward };

// ---- cuDNN engine tuning ------------------------------------------------------------------------
// cuDNN's heuristics rank the engine configurations that can run a graph by a model, and at short
// sequences its first choice is not always the fastest: H100, 2026-11-26, b32 h32 L512 d64 causal,
// our graph got configuration eng2_k24=32 (0.153 ms) where PyTorch's older frontend got eng2_k24=7
// (0.133 ms) from the same list. For a problem cudnn_tunes() accepts, select() builds every
// configuration the heuristics offer (ranked and fallback lists) for the problem's [B, H, L, D]
// graph, times each on scratch tensors of the problem's shape (random values; the device is
// synchronized and the scratch freed before select returns) and keeps the fastest; a run with
// another memory layout builds its graph on that configuration (host work only; the heuristics'
// choice if cuDNN refuses it there). The one-off cost per problem shape: building every
// configuration (cuDNN compiles some at runtime) and a few timed runs of each (~0.4 s a graph on
// the H100). Other problems take the heuristics' first
// choice; set_cudnn_tuning_mode(CudnnTuningMode::off) turns tuning off.
//
// Accepted: what cuDNN is given (cudnn_screen) with at least kCudnnTuneMinFlops of work (below
// it, the tuning would cost more than it could save, and the tests' small shapes skip it), at most
// kCudnnTuneMaxArea query x key pairs per head (longer sequences measured at or above PyTorch
// with the heuristics' choice), and scratch within kCudnnTuneScratchBytes.
inline constexpr double kCudnnTuneMinFlops = 4e9;  // 4 B Hq Lq Lk Dk, halved when causal
inline constexpr int64_t kCudnnTuneMaxArea = int64_t{4096} * 4096;
inline constexpr int64_t kCudnnTuneScratchBytes = int64_t{1} << 30;
bool cudnn_tunes(const attention::Problem& p);

// What select() did for a problem's graph of one pass (canonical [B, H, L, D] layout) on `device`:
// configurations timed (0: not tuned, the heuristics' first choice runs) and the one that runs.
struct CudnnTuning {
  int timed = 0;
  std::string plan;  // cuDNN's name of the configuration, e.g. "eng2_k24=7" (of the release
                     // cudnn_loaded_version() names)
};
// nullopt: no graph was built for it (or this build has no cuDNN frontend).
std::optional<CudnnTuning> cudnn_tuning(const attention::Problem& p, Pass pass, bool deterministic,
                                        int device);

// cudnnGetVersion() of the cuDNN this process loaded (e.g. 91900), which may differ from the
// headers it was built with: the loader picks the first libcudnn.so.9 on its path. The engines,
// the tuning's choices and the selection table's cuDNN column are per release. nullopt: built
// without the cuDNN frontend.
std::optional<int64_t> cudnn_loaded_version();

// Whether select() tunes, process-wide: `by_size` (the default) as cudnn_tunes() says above;
// `off` never (every graph on the heuristics' first choice: no select-time timing, no scratch,
// no device synchronization); `any_size` drops the minimum of work (the other bounds stay), so
// tests tune small shapes and check them against the exhaustive reference. A graph keeps what it
// was built with (graphs are cached per problem).
enum class CudnnTuningMode : uint8_t { off, by_size, any_size };
void set_cudnn_tuning_mode(CudnnTuningMode mode);
CudnnTuningMode cudnn_tuning_mode();
// Sets a mode for a scope and restores the previous one. Not for use while other threads select
// plans.
class CudnnTuningScope {
 public:
  explicit CudnnTuningScope(CudnnTuningMode mode);
  ~CudnnTuningScope();
  CudnnTuningScope(const CudnnTuningScope&) = delete;
  CudnnTuningScope& operator=(const CudnnTuningScope&) = delete;

 private:
  CudnnTuningMode previous_;
};

// ---- The measured selection table ---------------------------------------------------------------

// The three candidates of each pass.
//  cudnn:   cuDNN's fused SDPA (cudnn_sdpa*).
//  bespoke: the attention family's own CUDA kernels (src/ops/attention).
//  fa3:     our sm_90a kernels (this directory; Hopper only): fa3_fwd_sm90a forward,
//           fa3_bwd_sm90a backward (not deterministic: a deterministic backward plan ranks cuDNN
//           against the bespoke kernel only).
enum class Candidate : uint8_t { cudnn, bespoke, fa3 };
std::string_view to_string(Candidate c);

// One measured point: every candidate timed on the same device in the same run
// (bench_attention attention_hopper prints these rows as {"table_point": ...} lines).
// Chunk points (len_q > 0, forward): a chunk of len_q queries at the end of len keys (GQA 4,
// causal bottom-right where causal), the shape of chunked prefill against a KV cache, which the
// Lq = Lk sweep does not measure.
struct TablePoint {
  DType dtype;
  Pass pass;
  int64_t head_dim;  // Dk (= Dv in the sweep)
  int64_t len;       // L = Lq = Lk of the sweep; chunk points: Lk
  bool causal;
  double cudnn_tflops;
  double bespoke_tflops;  // 0: the bespoke kernel did not run at this point
  double fa3_tflops = 0;  // fa3_fwd_sm90a / fa3_bwd_sm90a; 0: not measured or did not run
  int64_t len_q = 0;      // chunk points: Lq; 0: a point of the Lq = Lk sweep
};
// The table select() follows: the shipped one (selection_table.hpp) unless a
// SelectionTableOverride is alive.
std::span<const TablePoint> selection_table();
std::string_view selection_table_provenance();  // device, date, commit of the measurement

// The candidate the table says is fastest for this problem. A forward chunk (Lq < Lk) within 2x of
// a chunk point in head dim, Lq and Lk (the nearest one of its dtype and causality) takes that
// point's fastest runnable column. Otherwise: the nearest measured point of the
// same dtype, pass and causality (head dim first, then log-distance in max(Lq, Lk)), and there the
// largest TFLOP/s among cuDNN, the bespoke kernel and (where `fa3_runs`: the pass's fa3 kernel
// fits this problem on this device, and where Lq is within 2x of the point's L: the column was
// measured with Lq = Lk, so decode-like problems never go to fa3 on its strength) fa3; a column
// displaces the one before it (cuDNN, then bespoke, then fa3) only when it leads by more than
// kTableLeadMargin, so ties go to cuDNN, then bespoke. Candidate::cudnn when the
// table has no point for the dtype/pass (the fastest peer measured through PyTorch). Problems
// cuDNN is not given (cudnn_screen: soft-capping, ...) and packed sequences (varlen: cuDNN's
// ragged layout by name or only(Backend::cudnn); no measured point ranks it first) rank bespoke
// and fa3 only (varlen: at the point of the longest sequence), and default to bespoke.
// `cudnn_built` false: rank as if cuDNN were not built (see candidate_here).
// A lead the table's run-to-run spread covers is not a lead (the card runs at its power cap, and
// one kernel's rate moves 1-3% between rounds of a call). The bf16 Lq = Lk points' backward at
// d128 L512 causal had fa3 at 172.2 TFLOP/s against cuDNN's 171.3 (H100, 4befacd): on the H200
// (forty-ninth session's call 3) the default plan's fa3 took 442.7 us where PyTorch's cuDNN took
// 403.4 (0.91x). A 1% margin moves that point and three others whose lead was under it (chunk
// points d128 Lq 1024 / 4096 keys, 0.4%, and Lq 4096 / 16384 keys, 0.6%; f16 d256 L2048 backward,
// 0.5%) to cuDNN.
inline constexpr double kTableLeadMargin = 0.01;
Candidate preferred_candidate(std::span<const TablePoint> table, const attention::Problem& p,
                              Pass pass, bool fa3_runs, bool cudnn_built = true);
// The same over selection_table().
Candidate preferred_candidate(const attention::Problem& p, Pass pass, bool fa3_runs,
                              bool cudnn_built = true);
// Whether cuDNN is here to serve the problem: this build has the cuDNN frontend, the device is one
// cuDNN's SDPA runs on (a GPU from sm_80) and cudnn_screen gives cuDNN the problem. Builds no
// graph: a select() that ends on another backend (only(bespoke_cuda), the fa3 entries' own checks)
// must not pay for cuDNN's graphs or its tuning, so a graph cuDNN refuses for a problem it is given
// still falls through to the registry's next entry.
bool cudnn_serves(const attention::Problem& p, const DeviceCaps& caps);
// The candidate the fa3 kernels' ranked-ahead entries follow (fa3 runs): the table's, or where it
// names cuDNN and cuDNN does not serve the problem here (cudnn_serves), the table's pick among the
// others (the registry would otherwise fall through to the family's kernels whatever fa3's column
// says: groups of 1 at d256, Lq 17-256 new rows, 4-64 sequences, ran there 1.0-3.0x fa3's time in
// a build without the frontend, forty-seventh session).
Candidate candidate_here(const attention::Problem& p, Pass pass, const DeviceCaps& caps);

// Whether the pass's fa3 kernel (forward: fa3_fwd_sm90a, fa3_fwd_sm90a_paged for a paged problem,
// fa3_fwd_sm90a_seqused for one with key counts; backward: fa3_bwd_sm90a; the entries pinned by
// name) fits the problem on this device: false in a build without it (no CUDA, or no sm_90a code)
// and on any GPU but sm_90.
bool fa3_fits(const attention::Problem& p, const DeviceCaps& caps, Pass pass = Pass::forward);

// For measurements and tests: while alive, select() follows `table` instead of the shipped one
// (an empty table ranks cuDNN ahead everywhere, so PlanPreference::only(Backend::bespoke_cuda)
// reaches no ranked-ahead fa3 entry; fa3's deterministic entries, which fit wherever the table
// does not pick bespoke, it still reaches: bespoke_pick_points keep them out).
// Process-wide; nest in stack order; `table` must outlive the override; not for use while other
// threads select plans.
class SelectionTableOverride {
 public:
  explicit SelectionTableOverride(std::span<const TablePoint> table);
  ~SelectionTableOverride();
  SelectionTableOverride(const SelectionTableOverride&) = delete;
  SelectionTableOverride& operator=(const SelectionTableOverride&) = delete;

 private:
  std::span<const TablePoint> table_;
  const std::span<const TablePoint>* previous_;
};

// A table that picks the bespoke candidate for every problem of dtype `t` outside the rules that
// come before the table (decode, fa3_packs, wide_head_decode): a point per pass and causality, so
// that every problem's nearest point is one of them. Under it PlanPreference::only(
// Backend::bespoke_cuda) selects what a bespoke pick yields, the family's kernels
// (bench_attention's bespoke column and rows).
inline std::array<TablePoint, 4> bespoke_pick_points(DType t) {
  return {TablePoint{t, Pass::forward, 128, 4096, false, 0, 1, 0},
          TablePoint{t, Pass::forward, 128, 4096, true, 0, 1, 0},
          TablePoint{t, Pass::backward, 128, 4096, false, 0, 1, 0},
          TablePoint{t, Pass::backward, 128, 4096, true, 0, 1, 0}};
}

// Forward problems with at most this many query rows are decode-shaped: the table (measured with
// Lq = Lk) does not speak for them, and the family's decode kernel is the measured winner except
// where fa3_packs (kFa3PackedDecodeRows) or wide_head_decode.
inline constexpr int64_t kDecodeQueryRows = 16;
// A forward chunk of at least this many query rows against a cache of about a table point's length
// takes fa3's column as measured at the point (it kept its rate there from Lq 256 up); from
// fa3_chunk_rows_over_bespoke rows where the alternative is the family's kernels (a build without
// cuDNN, or a problem cuDNN is not given). See preferred_candidate.
inline constexpr int64_t kFa3ChunkRows = 256;
// Against the family's kernels fa3 took every chunk longer than a decode (groups of 1, 4 x 32
// heads, causal bottom-right, a build without cuDNN, H200, 2026-11-30, e221e2f for d256, a96ede0
// for the others), 4096 keys: Lq 17 d64 50.0 us against 53.9, d128 72.0 against 91.7, d256 139.4
// against 188.4; but at d64 against 16384 keys the family's kernel led at Lq 17 and 32 (150.3 /
// 152.4 us against fa3's 180.2 / 182.0) and tied at 64 (184.6 against 183.6):
// kFa3ChunkRowsOverBespokeD64LongCache rows from kFa3ChunkLongCacheKeysD64 keys.
inline constexpr int64_t kFa3ChunkRowsOverBespoke = kDecodeQueryRows + 1;
inline constexpr int64_t kFa3ChunkRowsOverBespokeD64LongCache = 64;
inline constexpr int64_t kFa3ChunkLongCacheKeysD64 = 8192;
int64_t fa3_chunk_rows_over_bespoke(int64_t head_dim, int64_t len_k);
// A forward chunk of more than kDecodeQueryRows query rows (or a decode-shaped one, see
// kFa3PackedDecodeRows; at most fa3_packed_chunk_rows) against a longer cache, bf16 / f16, Dk = Dv
// = 64, 128 or 256, GQA group 2..16 (a power of two): fa3's packed instance (kFa3PackedKernel, or
// kFa3PackedPagedKernel over paged K / V) runs it, and fa3 is the candidate wherever its kernels
// fit (preferred_candidate, over any table but an empty one; the ranked-ahead entry then launches
// the packed instance). Measured on the H200 (`bench_attention attention_packed`, 2026-11-30: 4
// sequences x 32 query heads in groups of 1-16, causal bottom-right, Lq 17-256 new rows against
// 4096- and 16384-key caches; docs/perf/attention.md, forty-fourth session):
// - d128: up to kFa3PackedChunkRows rows 1.00-3.8x the best of cuDNN, plain fa3 and the family's
//   kernels in groups 2-16 (Lq 32, group 4, 4096 keys: 263 TFLOP/s against cuDNN's 148); at Lq 256
//   plain fa3 led against 4096 keys (600-632 against 599-623) and the packed one against 16384
//   (673-709 against 613-708): kFa3PackedLongCacheRows from kFa3PackedLongCacheKeys keys on;
// - d64: up to kFa3PackedChunkRowsD64 rows 1.1-3.2x the best other in groups 2-16 (Lq 32, group
//   4, 16384 keys: 312 against cuDNN's 119); from Lq 128 cuDNN led (382-470 against 338-404);
// - group 1 (the key split alone): cuDNN from 0.3% behind to 5% ahead of both fa3 instances at
//   d128, 12-18% ahead at d64: the table's pick;
// - d256 (forty-sixth session, same sweep): up to kFa3PackedChunkRowsD256 rows 1.19-3.8x the best
//   other in groups 2-16 (Lq 32, group 8, 16384 keys: 121.5 us against cuDNN's 362.2); from Lq 128
//   cuDNN led (group 4, 4096 keys: 104.7 us against 112.2).
inline constexpr int64_t kFa3PackedChunkRows = 128;
inline constexpr int64_t kFa3PackedChunkRowsD64 = 64;
inline constexpr int64_t kFa3PackedChunkRowsD256 = 64;
inline constexpr int64_t kFa3PackedLongCacheRows = 256;
inline constexpr int64_t kFa3PackedLongCacheKeys = 16384;
// Decode-shaped forwards (at most kDecodeQueryRows query rows: speculative decoding's few tokens
// in a GQA group) take the packed instance where it measured faster than the family's decode and
// short-row kernels (H200, `bench_attention attention_packed`, groups 1-16, Lq 1-16, 4 sequences
// against 4096 / 16384 keys and 64 against 1024 / 4096; docs/perf/attention.md, forty-fifth and
// forty-sixth sessions). The rows are group x Lq:
// - d64 / d128: more than kFa3PackedDecodeRows, the rows the decode kernel holds (past them the
//   family's m16 kernel answered: Lq 3 in a group of 16, 48 rows, 1.22-2.67x the packed time), or
//   exactly that many from kFa3PackedDecodeMinLq tokens on (group 8, Lq 4, 16384 keys: 44.7 us
//   against 45.3; at Lq 2 in a group of 16 the decode kernel led, 14.1 against 17.1 at 4096 keys);
// - but where the grid is full without splitting the keys (more than kFa3PackedDecodeMaxKvHeads
//   sequences x K/V heads) only from a whole tile of rows (kFa3PackedTileRows): with 64 sequences
//   of 4-16 K/V heads the family's kernels took 0.70-0.98x the packed time at 24-64 rows (group 8,
//   Lq 4, d64, 4096 keys: 71.3 us against 96.9) and the packed instance 0.70-0.92x theirs at 128
//   (group 8, Lq 16, d128, 4096 keys: 143.8 us against 205.5); at 128 K/V heads (group 16) it led
//   from 48 rows (1.22-1.95x);
// - d256, whatever the grid: every decode but a single token in a group of 16 over fewer than
//   kFa3PackedD256SingleTokenKeyRows keys in all (sequences x K/V heads x keys). The decode kernel
//   holds one 16-row tile at d256; the packed instance took 0.27-0.98x its time (or the family's
//   m16 / general kernel's) at every other decode of groups 2-16 on 4, 16 and 64 sequences against
//   4096 / 16384, 1024 / 4096 and 1024 / 4096 keys (forty-seventh session, call 4: group 2, Lq 4,
//   64 sequences, 1024 keys 278.2 us against 334.0). One token in a group of 16 (call 2): the
//   decode kernel led at 16384-32768 key rows (4 sequences x 4096 keys: 20.4 us against 24.4; 16
//   x 1024: 21.8 against 24.6), the packed instance from 65536 (8 x 4096: 30.7 against 32.6; 32 x
//   1024: 29.5 against 35.6) up (64 x 4096: 140.5 against 158.8).
inline constexpr int64_t kFa3PackedDecodeRows = 32;
inline constexpr int64_t kFa3PackedDecodeMinLq = 4;
inline constexpr int64_t kFa3PackedDecodeMaxKvHeads = 128;
inline constexpr int64_t kFa3PackedTileRows = 128;
inline constexpr int64_t kFa3PackedD256SingleTokenKeyRows = 65536;
// The most query rows fa3_packs takes at this head dim (Dk = Dv) and cache length; 0 where none.
int64_t fa3_packed_chunk_rows(int64_t head_dim, int64_t len_k);
bool fa3_packs(const attention::Problem& p);
// Where fa3 is the pick (the table's, or candidate_here without cuDNN) for a chunk in a group of 1
// against a long cache, its packed instance (the key split alone) ran faster than the plain one
// by name (4 sequences x 32 heads, 16384 keys, causal bottom-right, H200, forty-eighth session's
// call 4): d128 Lq 17 / 32 / 64 253.5 / 256.0 / 257.9 us against 269.3 / 282.6 / 275.7, d64 Lq 64
// 171.5 against 179.4 (d64 takes fa3 from Lq 64 there: fa3_chunk_rows_over_bespoke); as the
// default plan's instance (forty-ninth session's call 1) 252.7 / 253.6 / 253.8 against 267.4 /
// 266.1 / 276.9. At 4096 keys the two were within 2%. Padded problems without key counts or
// pages, as measured.
inline constexpr int64_t kFa3PackedUngroupedMaxRows = 64;
bool fa3_packs_ungrouped(const attention::Problem& p);
// Short sequences, where fa3 is the pick: its persistent variant (one CTA an SM looping over the
// work tiles, the next tile's loads under this one's epilogue) in place of the plain one, for
// padded problems of Lq and Lk up to kFa3PersistentMaxLen (up to eight key tiles a work tile).
// Measured (H200, 16k tokens as B x L, hidden 2048, bf16, TFLOP/s plain -> persistent): fifty-
// eighth session's call 3, d128 L128 178.0 -> 225.4 (causal 83.8 -> 104.0), L256 281.6 -> 324.5
// (152.3 -> 175.0), L512 causal 252.7 -> 280.9, L1024 causal 373.5 -> 376.6; d64 L128 125.3 ->
// 154.8 (55.6 -> 69.2), L256 193.1 -> 228.0 (100.0 -> 119.8), L512 274.4 -> 292.2 (163.2 ->
// 185.1), L1024 348.4 -> 356.0 (240.9 -> 261.5); unbanded d128 with one-group sections
// (fa3_section_heads; fifty-ninth session's call 2, f4409d7, two runs) L512 406.9-408.7 ->
// 461.7-462.6, L1024 530.8-532.0 -> 536.2-567.4. From L2048 the plain kernel (or d64's 192-row
// one) leads: d128 615.6-623.0 against 577.5-577.8 (call 2; causal 493.7 against 448.3, call 1),
// d64 400.8 / 447.0 against 376.9.
inline constexpr int64_t kFa3PersistentMaxLen = 1024;
// Since the persistent variant stores O by TMA (a116eb0) it also leads the plain one at d128
// unmasked up to L2048 (H200, bf16, sixty-eighth session, 0a199d1, three processes, each point
// plain then persistent, TFLOP/s; f16 problems take the same rule, not timed against the plain
// instance): L2048 634.3-634.9 -> 645.8-669.8 (cuDNN 651.3-652.1 in the same
// processes); not causal L2048 (507.1-507.3 -> 489.9-495.9), nor L4096 (653.7-682.3 -> 609.4-690.8,
// causal 585.6-595.1 -> 519.5-546.4), nor d64 at L2048, where the 192-row instance leads
// unmasked (469.4-476.6 against 422.5-426.3).
inline constexpr int64_t kFa3PersistentUnmaskedD128MaxLen = 2048;
// Since the persistent variant has a causal form (half key tiles on the diagonal, 4dd3805) it also
// leads at d64 causal up to L2048, where the 192-row instance (from kFa3WideMinRows rows) or the
// plain one ran (H200, bf16, sixty-ninth session): L2048 392.7 against the 192-row 356.8 (call 5,
// one process, persistent timed first; cuDNN 396.4) and 391.5 against the plain 335.2 (calls 3 and
// 2, medians of 3 rounds), L1024 325.8 against the plain 256.6; not by enough at causal L4096
// (430.0 against 423.0, call 5). Since its banded sections turn every CTA through every query block
// (fa3_section_heads, seventieth session) it leads at d128 causal up to L2048 too: L2048
// 539.6-543.5 against the plain 509.2-509.9 (call 3, two processes each; cuDNN 533.5). Causal masks
// (right bound 0, no left bound), either diagonal; measured at Lq = Lk.
inline constexpr int64_t kFa3PersistentCausalMaxLen = 2048;
// Since its paired walk (fa3_walks_in_pairs, seventy-first session) the persistent variant leads at
// causal L4096 too, both head dims (H200, bf16, 16k tokens as B x L, TFLOP/s): d128 621.7 / 611.3
// against the plain instance's 597.5 / 604.2 (calls 1 / 2, two processes each; cuDNN 586.0 /
// 593.1), d64 435.8 against the plain 395.8 and the 192-row instance's 423.0 (sixty-ninth
// session's call 5); not d128 at L8192 (590.7 / 581.9 against 614.5 / 644.7). So causal problems of
// more than kFa3PersistentCausalMaxLen query rows persist up to this many queries and keys: long
// query sequences, as measured (chunks of fewer rows against longer caches keep their instances).
inline constexpr int64_t kFa3PersistentPairedCausalMaxLen = 4096;
bool fa3_persists(const attention::Problem& p);
// Head dim 64 from kFa3WideMinRows query rows on, where fa3 runs: its 192-row instance
// (kFa3WideKernel) in place of the plain one. Measured (H200, bf16, 16k tokens as B x L, 32 heads,
// fifty-third session's call 1, two runs, TFLOP/s plain -> wide): L2048 400 -> 430-444 (causal
// 316-317 -> 340-341), L4096 428 -> 456-464 (375-376 -> 384-387), L8192 439-442 -> 513-514
// (407-410 -> 466), L16384 444 -> 510-517 (434-439 -> 489-492). Shorter, causal rows lost (L1024
// 241-243 -> 229, L512 163 -> 161-162) where unmasked ones gained 6% (L512 274 -> 291, L1024 347 ->
// 366; cuDNN leads both by 18-33%). Padded problems without key counts or pages, as measured.
inline constexpr int64_t kFa3WideMinRows = 2048;
bool fa3_widens(const attention::Problem& p);
// The persistent variant's head dims (its fits, launch and fa3_persists): Dk = Dv = 64 or 128. Its
// O staging buffer leaves D = 256 no room, and MLA's 192 / 128 is not instantiated.
constexpr bool fa3_persistent_dims(int64_t dk, int64_t dv) {
  return dk == dv && (dk == 64 || dk == 128);
}
// n / d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high and a shift (the round-up method
// of Granlund & Montgomery with p = 31 + ceil(log2 d): mul = ceil(2^p / d) < 2^32, exact for n <
// 2^31). The persistent forward's consumers compute their work tile's coordinates on their
// critical path twice a tile; GPUs have no integer divider (a 32-bit `/` is ~25 instructions
// through the float reciprocal, on the vector pipe only).
struct Fa3Div {
  uint32_t d = 1, mul = 0, shr = 0;  // d == 1: the quotient is n
};
constexpr Fa3Div fa3_div(int64_t d) {
  if (d <= 1) return {};
  uint32_t l = 0;  // ceil(log2 d)
  while ((int64_t{1} << l) < d) ++l;
  const uint64_t ud = static_cast<uint64_t>(d);
  return {static_cast<uint32_t>(d),
          static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + ud - 1) / ud), l - 1};
}
constexpr int fa3_quot(int n, const Fa3Div& v) {
  return v.d == 1 ? n
                  : static_cast<int>(
                        static_cast<uint32_t>((uint64_t{static_cast<uint32_t>(n)} * v.mul) >> 32) >>
                        v.shr);
}
// The persistent variant's walk's divisors for one launch (fa3_work_tile): the tiles of a section,
// the heads of a whole section (the section size) and of the last (partial) one.
struct Fa3WalkDivs {
  Fa3Div section_tiles, section, last_section;
};
constexpr Fa3WalkDivs fa3_walk_divs(int m_blocks, int bh_count, int section) {
  const int last = bh_count % section == 0 ? section : bh_count % section;
  return {fa3_div(int64_t{section} * m_blocks), fa3_div(section), fa3_div(last)};
}
// The persistent variant's walk over its work tiles (query block m of head bh of the B x Hq
// heads), in sections of `section` consecutive heads: a section's heaviest query blocks (the last
// ones, under a causal bound) of every head first, then the next block down, then the next
// section. A section of one head is the plain kernel's launch order, query block fastest. Work
// tile w of m_blocks x bh_count, by fa3_walk_divs(m_blocks, bh_count, section).
struct Fa3WorkTile {
  int m_block, bh;
};
constexpr Fa3WorkTile fa3_work_tile(int w, int m_blocks, int bh_count, const Fa3WalkDivs& v) {
  const int section = static_cast<int>(v.section.d);
  const int first = fa3_quot(w, v.section_tiles) * section;
  const Fa3Div& heads = bh_count - first < section ? v.last_section : v.section;
  const int r = w - first * m_blocks, q = fa3_quot(r, heads);
  return {m_blocks - 1 - q, first + r - q * static_cast<int>(heads.d)};
}
// The persistent variant's paired walk, for causal problems where a CTA runs no more work tiles
// than a head has query blocks (fa3_walks_in_pairs: long causal sequences over few heads; an
// instance of its own, the causal form's, so that the others keep their SASS). There
// the sections leave a CTA's tiles an uneven mix of heavy and light blocks (the busiest CTA 1.5x
// the mean at 16k tokens, d128 L4096, 132 CTAs, simulated), and even where they balance (L2048:
// within 3%) the pairs measured faster (a head's K / V read again a round later, from L2).
// A head's heavy blocks (m_blocks - 1 - j, j < m_blocks / 2) in heavy order i = head * m_blocks / 2
// + j; rounds in pairs: round 2r runs heavy tiles r * ctas + c, round 2r + 1 their light
// complements (block j) on the same CTAs c, so every CTA's pair weighs m_blocks + 1 key tiles and
// a head's K / V are read again a round later. The heavy tiles past whole round pairs, then their
// complements, then (odd m_blocks) every head's middle block.
struct Fa3PairWalk {
  Fa3Div ctas, half;  // the grid; m_blocks / 2, a head's heavy blocks
  int paired, rest;   // tiles in whole round pairs; heavy tiles past them
};
constexpr Fa3PairWalk fa3_pair_walk(int m_blocks, int bh_count, int ctas) {
  const int64_t heavy = int64_t{bh_count} * (m_blocks / 2), whole = heavy / ctas * ctas;
  return {fa3_div(ctas), fa3_div(m_blocks / 2), static_cast<int>(2 * whole),
          static_cast<int>(heavy - whole)};
}
constexpr Fa3WorkTile fa3_pair_tile(int w, int m_blocks, const Fa3PairWalk& v) {
  int i = 0;  // the heavy tile w is, or whose complement it is
  bool light = false;
  if (w < v.paired) {
    const int ctas = static_cast<int>(v.ctas.d), k = fa3_quot(w, v.ctas);
    i = (k >> 1) * ctas + w - k * ctas, light = (k & 1) != 0;
  } else {
    const int r = w - v.paired;
    if (r >= 2 * v.rest) return {m_blocks / 2, r - 2 * v.rest};  // odd m_blocks: the middles
    light = r >= v.rest, i = v.paired / 2 + r - (light ? v.rest : 0);
  }
  const int h = fa3_quot(i, v.half), j = i - h * static_cast<int>(v.half.d);
  return {light ? j : m_blocks - 1 - j, h};
}
// Paired where the launch has no more rounds of the grid than a head has query blocks. Measured
// (H200, bf16, 16k tokens as B x L, hidden 2048, 132 CTAs, seventy-first session, the persistent
// instance by name, TFLOP/s sections -> paired, both walks forced on one build): causal d128 L2048
// (16 blocks, 15.5 rounds) 533.4 -> 561.4 (medians of 3 processes; cuDNN 535.6), L4096 425.5 ->
// 621.7, L8192 472.5 -> 590.7, L16384 534.8 -> 582.3 (2 processes); d64 L4096 (32 blocks, 31
// rounds) 427.9 -> 435.8. With more rounds than blocks it lost: d128 L1024 457.6 -> 451.0, L512
// 338.2 -> 309.9, d64 L1024 326.9 -> 313.9, L512 244.1 -> 209.3; d64 L2048 (31 rounds, 16
// blocks) even, 391.1 -> 391.7.
constexpr bool fa3_walks_in_pairs(int64_t m_blocks, int64_t n_work, int64_t ctas, bool banded) {
  return banded && m_blocks > 1 && n_work <= m_blocks * ctas;
}
// The heads a section spans, for a launch of `ctas` CTAs over m_blocks x bh_count work tiles.
// - Unbanded (every query block sees every key: work tiles of one weight): one group of query
//   heads, so that the CTAs running at once share the K / V of about SMs / m_blocks heads, as the
//   plain kernel's do. Sections of every head whose K / V fit in 32 MiB of L2 had the 132 CTAs
//   read up to 32 MiB of K / V at once, from DRAM again for each round of query blocks (d128
//   L2048: 624 MB read from DRAM a launch against 201 MB, the Q / K / V bytes; 489 against 447 us,
//   ncu). One group ran 1.09 / 1.11 / 1.04 / 1.01 / 1.03 / 1.06x those sections at d128 L512-
//   16384, 0.99-1.03x at d64 (H200, 16k tokens as B x L, hidden 2048, fifty-ninth session's call
//   1, one run each).
// - Banded (causal: a block's weight grows with its index): CTA c runs tiles c, c + ctas, ... of
//   the walk, so its query block moves by (ctas mod section tiles) / section blocks a round. The
//   fewest heads (whole groups or not: consecutive sections run together) for which that is a
//   whole number of blocks coprime to m_blocks, so that every CTA turns through every query block
//   of a section, heaviest to lightest, once in m_blocks rounds (the CTAs end together), while the
//   few heads in flight keep their K / V in L2 between their blocks (132 CTAs: 4 heads at any
//   power-of-two m_blocks up to 32). Where none of up to kFa3SectionMaxHeads heads does, a round
//   of CTAs' heads (`ctas`: exactly a block a round, but a round between a head's blocks). One
//   group lost 11-24% (fifty-ninth session: at 132 CTAs each CTA kept the query block of its index
//   mod m_blocks). Sections of the heads whose K / V fit in 32 MiB (the rule until the seventieth
//   session) turned the CTAs' blocks but read a head's K / V from DRAM again a section later, and
//   sections of 8 heads turn a block only every second round (half of L2048's 16 blocks in its 15.5
//   rounds). H200, bf16, 16k tokens as B x L, hidden 2048, TFLOP/s, medians of two processes
//   (seventieth session's call 3), d128 causal L256 / L512 / L1024 / L2048: 32 MiB 190.6 / 313.7 /
//   413.5 / 497.4, 8 heads 217.6 / 339.8 / 441.4 / 397.3, this rule (4) 220.5 / 340.9 / 465.4 /
//   541.6 (cuDNN 233.8 / 344.6 / 451.2 / 533.5); d64 causal +0.7-2.4% over 32 MiB.
inline constexpr int64_t kFa3SectionMaxHeads = 64;
constexpr int fa3_section_heads(int64_t group, int64_t bh_count, int64_t m_blocks, int64_t ctas,
                                bool banded) {
  int64_t heads = group < 1 ? 1 : group;
  if (banded && m_blocks > 1) {
    ctas = ctas < 1 ? 1 : ctas;
    heads = ctas;
    for (int64_t s = 1; s <= kFa3SectionMaxHeads; ++s) {
      const int64_t step = ctas % (s * m_blocks);
      if (step % s == 0 && std::gcd(step / s, m_blocks) == 1) {
        heads = s;
        break;
      }
    }
  }
  return static_cast<int>(heads < bh_count ? heads : bh_count);
}
// Decode-shaped forwards of plain multi-head attention (group 1) with 256-wide heads (Dk = Dv =
// 256, bf16 / f16, fewer rows than keys), where fa3 runs: not the family's decode kernel (it holds
// one 16-row tile at d256) but fa3's plain instance for one token and cuDNN from 2 (fa3 where
// cuDNN does not serve the problem: candidate_here). Measured on the H200 (`bench_attention
// attention_packed`, Lq 1-16, forty-seventh session, call 3), 4 sequences x 32 heads against 4096
// keys / 16 and 64 against 1024: the decode kernel 154.5-156.6 / 158.7-169.9 / 603.9-689.2 us, fa3
// 137.0-137.8 / 141.5-143.4 / 533.1-549.4, cuDNN 273.6 / 273.5 / 1071.2 at Lq 1 and 128.3-129.1 /
// 130.3-133.7 / 487.8-515.0 from Lq 2.
bool wide_head_decode(const attention::Problem& p);

// Priorities the cuDNN kernels register with. The attention family's bespoke kernels are expected
// between kCudnnBehind and kCudnnAhead, so the table decides which of the two wins `fastest`.
inline constexpr int kCudnnAhead = 1000;
inline constexpr int kCudnnBehind = 1;
// cuDNN's deterministic algorithm where the table ranks cuDNN ahead: below fa3's ranked
// deterministic entry (kFa3DetAhead), which takes the points where fa3's leads it.
inline constexpr int kCudnnDeterministicAhead = kCudnnAhead - 2;

// fa3_fwd_sm90a is registered once per schedule or instance below: the plain schedule, the
// pingpong one, two with part of the softmax's exp2 on the FMA pipe (2 or 3 of every 8 column
// groups), a persistent one (one CTA per SM looping over work tiles), the plain one reading
// per-sequence key counts (seqused_k), the plain one reading a paged K / V pool (with or without
// counts: the only ones that take them), the GQA-packed ones and the 192-row one, below every
// other forward kernel (reached by name: A/B, tests); and once more as kFa3RankedAhead (the
// instance fa3_ranked_forward_kernel names), above everything, fitting only where the table picks
// fa3 among the candidates that serve the problem here (candidate_here).
inline constexpr std::string_view kFa3Kernel = "fa3_fwd_sm90a";
inline constexpr std::string_view kFa3PingpongKernel = "fa3_fwd_sm90a_pingpong";
inline constexpr std::string_view kFa3Exp2Poly2Kernel = "fa3_fwd_sm90a_exp2poly2of8";
inline constexpr std::string_view kFa3Exp2Poly3Kernel = "fa3_fwd_sm90a_exp2poly3of8";
inline constexpr std::string_view kFa3PersistentKernel = "fa3_fwd_sm90a_persistent";
inline constexpr std::string_view kFa3CountsKernel = "fa3_fwd_sm90a_seqused";
// Paged pools: any page size (pages of a whole key tile or half of one, 128 keys or 64 at head dim
// 256, load as TMA boxes; others as rows copied by the producer warpgroup).
inline constexpr std::string_view kFa3PagedKernel = "fa3_fwd_sm90a_paged";
// Short query chunks against long caches (speculative decoding, small prefill chunks): a CTA's
// 128 rows are the group's query heads times 128 / group queries (GQA packing, group 1..16 a power
// of two), and the keys split across CTAs where the grid would not fill the GPU, merged by the
// rows combine (flash_rows_combine, in split order). Padded or varlen Q, Dk = Dv = 64, 128 or 256,
// key counts where given. By name, and through kFa3RankedAhead where fa3_packs.
inline constexpr std::string_view kFa3PackedKernel = "fa3_fwd_sm90a_packed";
// The same over paged K / V pools (any page size, as fa3_fwd_sm90a_paged reads them).
inline constexpr std::string_view kFa3PackedPagedKernel = "fa3_fwd_sm90a_packed_paged";
// Head dim 64 on 192-row tiles (three consumer warpgroups, FlashAttention-3's d64 tile): the plain
// schedule otherwise, with everything it takes but Dk = Dv = 64 alone. By name, and through
// kFa3RankedAhead where fa3_widens.
inline constexpr std::string_view kFa3WideKernel = "fa3_fwd_sm90a_m192";
inline constexpr std::string_view kFa3RankedAhead = "fa3_fwd_sm90a_ranked_ahead";
// The instance kFa3RankedAhead launches for a problem, as the name that pins it: the packed ones
// where fa3_packs (and fa3_packs_ungrouped), the persistent one where fa3_persists, the wide one
// where fa3_widens, else the paged, counts or plain one. Bit for bit the same outputs; the bench's
// fa3 column times it.
std::string_view fa3_ranked_forward_kernel(const attention::Problem& p);
// The fp8 forward (issue 8's stretch): e4m3 Q, K, V with per-tensor descales, Y in bf16 or f16,
// Dk = Dv in {64, 128, 256}, padded or varlen layouts; V is transposed into the workspace first
// (8-bit wgmma reads both operands K-major). The only GPU kernel of element e4m3.
inline constexpr std::string_view kFa3Fp8Kernel = "fa3_fwd_fp8_sm90a";
// Its pingpong and exp2-offload schedules, pinnable by name (A/B).
inline constexpr std::string_view kFa3Fp8PingpongKernel = "fa3_fwd_fp8_sm90a_pingpong";
inline constexpr std::string_view kFa3Fp8Exp2Poly2Kernel = "fa3_fwd_fp8_sm90a_exp2poly2of8";
inline constexpr std::string_view kFa3Fp8Exp2Poly3Kernel = "fa3_fwd_fp8_sm90a_exp2poly3of8";
// The default fp8 schedule skips O's rescale where no row of a warp moved its max (exact); this
// one rescales every tile (fa3_fwd_sm90a's plain schedule over e4m3).
inline constexpr std::string_view kFa3Fp8EagerRescaleKernel = "fa3_fwd_fp8_sm90a_eagerrescale";
// Above cuDNN's ranked-ahead entries (kFa3DetAhead, the deterministic backward's ranked entry,
// sits below cuDNN's non-deterministic one).
inline constexpr int kFa3Ahead = kCudnnAhead + 2;

// Our sm_90a backward (fa3_backward.cuh): dQ accumulated by float reductions in L2 in arrival
// order (not deterministic). Registered like the forward: below every other backward kernel
// (reached by name; the D = 64 instances below too), and as kFa3BwdRankedAhead above everything,
// fitting only where the table picks fa3 for the backward, its walks split over a GQA group's
// heads where that balances the grid (fa3_bwd_head_parts).
inline constexpr std::string_view kFa3BwdKernel = "fa3_bwd_sm90a";
inline constexpr std::string_view kFa3BwdRankedAhead = "fa3_bwd_sm90a_ranked_ahead";
// The same at D = 64 with three warpgroups over 192 keys a CTA (two over 128 otherwise), no
// soft-capping. By name: kFa3BwdQ128Kernel was faster at every point both were timed at.
inline constexpr std::string_view kFa3BwdK192Kernel = "fa3_bwd_sm90a_k192";
// D = 64 with 128 query rows a step (two warpgroups over 128 keys; FlashAttention-3's d64 tile), no
// soft-capping. By name, and through kFa3BwdRankedAhead where fa3_bwd_widens.
inline constexpr std::string_view kFa3BwdQ128Kernel = "fa3_bwd_sm90a_q128";
// D = 64 and 128 with dQ's adds in a fixed order (bitwise-equal reruns; precision_guarantee says
// deterministic): each 64-row chunk of the dQ accumulator takes its key blocks' adds one after
// another, highest key block first, each CTA waiting for the count of those before it; unmasked
// problems rotate the walks over two accumulators, each with that order (fa3_backward.cuh, kDet).
// By name.
inline constexpr std::string_view kFa3BwdDeterministicKernel = "fa3_bwd_sm90a_deterministic";
// The same with each key block's walk split over the group's heads where fa3_bwd_head_parts says
// (dK / dV from f32 shares summed in part order; a key block's parts take their tickets after
// every part of the higher key blocks, so each dQ chunk's adds keep their falling order), by name.
// Bitwise-equal reruns as the unsplit instance; at or above its speed at every point measured
// (within the rounds' 3% where it does not split; 1.07-2.2x in causal groups of 8 / 16 from L1024,
// seventy-ninth session: 4k tokens in groups of 8 at L4096 341.1 against 155.4).
inline constexpr std::string_view kFa3BwdDeterministicHeadSplitKernel =
    "fa3_bwd_sm90a_deterministic_head_split";
// The same split with the heaviest walks first (by name; the ranked deterministic entry's order
// where kFa3DetRising says): where the walks do not rotate (a causal or band mask), tickets go key
// block major and rising, each dQ chunk takes its adds in rising key-block order, and each CTA
// walks its heads query block by query block from the last, so that the key blocks of a head
// reach a shared chunk at the same step; unmasked problems run as the split above. Its parts from
// fa3_bwd_det_parts in this order. Measured (H200, eightieth session, interleaved
// rounds): 1.06-1.38x the falling order in causal groups of 8 / 16 from L2048 at 16k tokens, and in
// places ahead of the non-deterministic ranked entry itself (groups of 8 / 16 at L512 243.9 /
// 215.0, 234.7 / 210.4; groups of 4 at L2048 435.6 / 388.0); behind the falling order with short
// walks in small groups (groups of 2 at L1024 274.0 / 333.4) and with many heads' Q / dY a wave
// (64k tokens).
inline constexpr std::string_view kFa3BwdDeterministicHeavyFirstKernel =
    "fa3_bwd_sm90a_deterministic_heavy_first";
// The instance fa3_ranked_backward_kernel names, its grid's blocks taken key block first (every
// batch's and key head's longest causal walks in the first wave; fa3_backward.cuh, heavy_first).
// Not deterministic; by name, for measurement against the ranked instance.
inline constexpr std::string_view kFa3BwdHeavyFirstKernel = "fa3_bwd_sm90a_heavy_first";
// The same instance with each key block's walk over the group's query heads split over CTAs where
// the grid model finds that faster (fa3_bwd_head_parts; D = 64 / 128, padded), dK and dV summed
// from f32 shares in part order. Not deterministic (dQ as fa3_bwd_sm90a's); by name. The ranked
// entry (kFa3BwdRankedAhead) launches the same.
inline constexpr std::string_view kFa3BwdHeadSplitKernel = "fa3_bwd_sm90a_head_split";
// Both: split, and the split grid taken key block first. By name, for measurement.
inline constexpr std::string_view kFa3BwdHeadSplitHeavyFirstKernel =
    "fa3_bwd_sm90a_head_split_heavy_first";
// The split grid key block first with the deterministic rising order's walks (each CTA over its
// heads query block by query block from the last, unrotated: the key blocks of a head read the
// same Q / dY tiles at the same step), its parts the best split of that grid (Fa3BwdGrid::
// split_heavy_first). Not deterministic (dQ as fa3_bwd_sm90a's); by name, for measurement against
// the deterministic instance in that order, which ran ahead of the ranked entry in causal groups.
inline constexpr std::string_view kFa3BwdFallingKernel = "fa3_bwd_sm90a_falling";
// Where fa3's non-deterministic backward stores a dQ chunk's first add instead of zeroing the f32
// accumulator first (BwdParams::claims in fa3_backward.cuh; its instances at D = 128 and q128, the
// walks not falling): at most kFa3BwdFirstStoreMaxRows query and key rows (varlen: the longest
// sequences). Both: a chunk takes an add from every key block that sees it, so the claims' cost
// grows with the keys while the zeroing they save grows with the queries alone (a chunked prefill
// of 1024 queries against 16k keys is a long walk per chunk, unmeasured with claims). Measured
// (H200, eighty-fifth session's call 3, interleaved rounds, 16k tokens, TFLOP/s the ranked launch
// with / without, fa3_bwd_sm90a_ranked / _ranked_zeroed by name): d128 L512 unmasked / causal
// ungrouped 359.4 / 347.3, 236.6 / 220.1; in groups of 4 410.3 / 388.1, 242.2 / 218.8; of 8 421.0 /
// 397.6, 249.2 / 214.8; of 16 430.2 / 407.7, 228.6 / 206.9; L1024 1.02-1.04x (groups of 2 unmasked
// 446.6 / 463.3 against the default's 467.5, the same launch as the first); f16 L512 358.9 / 346.3,
// 235.9 / 219.4, L1024 0.98x / 1.03x; d64 (q128) L512 1.04x (ungrouped causal a tie),
// L1024 1.01-1.02x; 32k tokens causal in groups of 2 / 4 at L512 / L1024 1.05-1.13x. Behind from
// L4096 (0.90-0.99x: d128 L16384 causal 532.6 / 548.4, in groups of 8 479.1 / 523.5, of 16 459.8 /
// 509.6; d64 L16384 0.97-0.98x), where the zeroing is a small share of a long walk's time and every
// step's claim (an atomic with a round trip to L2) and ordering fence are not; at L2048 0.95-1.01x.
// Since a step takes no claim once its chunk's first add is marked (eighty-sixth session, call 1,
// fa3_bwd_sm90a_ranked_claims / _ranked_zeroed by name, d128 in groups of 1 / 4 / 8 / 16 and d64 of
// 1 / 4): L2048 1.00-1.02x at d128 and 0.99x at d64, L4096 0.98-1.01x, L8192 0.95-1.00x, L16384
// 0.95-1.00x (d128 causal in groups of 16 L8192 / L16384 463.9 / 491.1, 471.3 / 494.7): still
// behind from L4096, the bound kept. Measured at Lq = Lk only.
inline constexpr int64_t kFa3BwdFirstStoreMaxRows = 1024;
bool fa3_bwd_first_store(const attention::Problem& p);
// fa3_ranked_backward_kernel's launch as the ranked-ahead entry makes it, wherever that instance
// fits (the ranked-ahead entry fits only where the table picks fa3), by name for measurement; and
// the same with the f32 dQ accumulator zeroed before the main kernel and every add a reduce-add
// (as before a chunk's first add stored: BwdParams::claims in fa3_backward.cuh); and the same with
// a chunk's first add stored at every length (past kFa3BwdFirstStoreMaxRows).
inline constexpr std::string_view kFa3BwdRankedKernel = "fa3_bwd_sm90a_ranked";
inline constexpr std::string_view kFa3BwdRankedZeroedKernel = "fa3_bwd_sm90a_ranked_zeroed";
inline constexpr std::string_view kFa3BwdRankedClaimsKernel = "fa3_bwd_sm90a_ranked_claims";
// The split with 2, 4 or 8 parts whatever the model says (where that divides the group), by name:
// one bench run times every split of a point, to fit the model's per-CTA costs.
inline constexpr std::string_view kFa3BwdHeadSplitPartsKernels[] = {
    "fa3_bwd_sm90a_head_split_x2", "fa3_bwd_sm90a_head_split_x4", "fa3_bwd_sm90a_head_split_x8"};
// The split deterministic kernel once more, for PlanPreference::deterministic(): fitting where it
// leads cuDNN's deterministic algorithm (fa3_det_leads) and the table picks fa3 or cuDNN for the
// backward (not the family's kernels, which rank below it), at kFa3DetAhead: above cuDNN's
// deterministic entries (kCudnnDeterministicAhead, kCudnnBehind - 1) and the family's, below
// cuDNN's non-deterministic one (kCudnnAhead) and fa3's ranked-ahead one (kFa3Ahead), one of which
// fits wherever it does (cuDNN's where its graph builds): `fastest` never gets it. Its split runs
// in the rising order where kFa3DetRising says, else as _head_split's.
inline constexpr std::string_view kFa3BwdDeterministicRanked = "fa3_bwd_sm90a_deterministic_ranked";
// The same launch as the default backward where kFa3BwdDeterministicPicks says (the table picking
// fa3 or cuDNN: its rows were measured against both), at kFa3DetDefaultAhead, above fa3's
// ranked-ahead entry and cuDNN's: `fastest` and `deterministic()` both take it there.
inline constexpr std::string_view kFa3BwdDeterministicAhead = "fa3_bwd_sm90a_deterministic_ahead";
inline constexpr int kFa3DetDefaultAhead = kCudnnAhead + 3;
inline constexpr int kFa3DetAhead = kCudnnAhead - 1;
// Where fa3_bwd_sm90a_deterministic leads cuDNN's deterministic backward (fa3_det_leads): bf16 or
// f16, Dk = Dv, no soft-capping, padded, and one of these rows: its head dim, no mask or causal
// (then Lq = Lk, the only shape measured), min_group to max_group query heads a key head, from
// min_rows to max_rows query and key rows. Measured (H200, 16k tokens as B x L, 2048 hidden,
// TFLOP/s ours / cuDNN's deterministic, seventy-sixth session's call 4 unless named): d64 L512
// 271.3 / 228.0, L16384 433.9 / 287.9 (f16 271.5 / 227.7, 422.9 / 287.7; groups of 4 312.7 /
// 218.4, 425.9 / 291.5; groups of 8, call 3, 302.9 / 225.9, 372.5 / 293.4); d64 causal L512 175.4
// / 178.7, L1024 253.1 / 237.0, L16384 418.3 / 330.5 (groups of 4 from L512 202.9 / 167.3; groups
// of 8 0.90-0.98x in call 3); d128 L1024 438.4 / 422.9 (1.04x, f16 1.04x), L2048 515.0 / 475.6,
// L16384 545.3 / 484.0; d128 causal L1024 0.97x, L2048 418.6 / 391.8, L16384 520.5 / 451.2. d128
// unmasked in groups since 959fbbe's rotation (seventy-seventh session's call 3; groups of 2 in
// call 2, before it): groups of 2 L512 373.3 / 322.2, L16384 558.6 / 492.6; of 4 L512 419.6 /
// 331.4, L1024 503.0 / 409.9, L16384 554.4 / 486.1; of 8 435.0 / 338.5, 515.1 / 413.2, 558.9 /
// 489.3; of 16 447.6 / 339.6, 522.9 / 414.7, 561.8 / 491.9 (ungrouped L512 341.0 / 346.5). d128
// causal in groups, the walks split where fa3_bwd_grid says (the ranked entry's launch, by name
// fa3_bwd_sm90a_deterministic_head_split; seventy-ninth session's calls 2 and 3, interleaved
// rounds): groups of 2 (call 3; unsplit there but at L8192) L512 237.5 / 216.9, L2048 420.1 /
// 372.6, L16384 491.4 / 458.9 (1.07-1.13x at all six); of 4 L2048 400.0 / 383.8 and 393.7 / 379.5,
// L4096 463.2 / 414.6 and 429.3 / 399.1, L8192 480.8 / 443.1 and 468.0 / 431.1; of 8 L2048 400.6 /
// 386.4 and 396.8 / 383.0, L4096 460.0 / 425.6 and 456.2 / 425.7 (4k tokens 1.08 / 1.02x). Before
// the rising order cuDNN led the falling split in groups of 4 / 8 at L16384 (0.90 / 0.75x) and in
// groups of 16 from L2048 (0.74-1.02x); see below. Left to cuDNN: shorter problems, packed
// sequences (and until the eighty-second session d128 causal at 64k tokens in groups of 8 / 16 up
// to L4096: see below).
// d128 causal in groups of 4 at 64k tokens up to L4096 (eighty-fourth session, calls 2 / 3, three
// processes, falling there): L512 293.0 / 241.0, 294.4 / 245.7, 293.6 / 245.9; L1024 369.5 /
// 319.3, 379.9 / 323.8, 375.1 / 319.5; L2048 428.4 / 382.1, 434.6 / 380.9, 432.1 / 381.1; L4096
// 465.1 / 418.0, 469.1 / 424.3, 471.2 / 424.6 (L8192 480.7 / 450.3, once).
// Ungrouped d128 causal at L1024 with at most 64k key rows (4k tokens): the split rising (by name
// fa3_bwd_sm90a_deterministic_heavy_first) 287.8 / 248.2 (eighty-third session's call 1), 283.3 /
// 249.1 (eighty-second's call 3).
// No bound on a measured row's length (kFa3DetLeads, kGroupedBackwardPicks).
inline constexpr int64_t kNoBound = int64_t{1} << 62;
// Eightieth session (call 2, interleaved rounds, H200): the deterministic split in its rising order
// where kFa3DetRising says (fa3_bwd_sm90a_deterministic_heavy_first) against cuDNN's deterministic
// algorithm, d128 causal at 16k tokens: groups of 4 L512 232.8 / 223.6 (falling), L1024 317.6 /
// 308.6, L2048 435.6 / 382.9, L16384 551.9 / 451.2; of 8 L512 243.9 / 227.2, L4096 472.9 / 413.0,
// L16384 528.4 / 449.4; of 16 L512 234.7 / 229.5 (call 1: 233.1 / 229.5), L1024 330.9 / 312.5,
// L8192 524.5 / 433.5; at 4k tokens in groups of 2-16 1.05-1.39x; at 64k tokens in groups of 8 /
// 16 from L8192 1.06-1.12x (L512-L4096 0.87-1.05x: left to cuDNN, max_key_rows). d64 causal in
// groups of 4 / 16 at 16k tokens: 1.17-1.27x at every length (L2048 351.1 / 275.4 and 339.0 /
// 278.8); d128 causal in groups of 8 in f16 1.07-1.22x.
// Eighty-second session (call 3, interleaved rounds, after a788e1d stopped zeroing the f32 dQ
// accumulator): at 64k tokens the split (falling there) now leads cuDNN's deterministic algorithm
// in groups of 8 from L512 (273.3 / 241.4, L1024 332.0 / 315.6, L2048 407.6 / 373.7, L4096 445.8
// / 397.7) and of 16 (262.8 / 254.9, L1024 318.2 / 319.3, L2048 402.1 / 374.4, L4096 415.6 /
// 399.8): the groups-of-8-to-16 row has no key-row bound since.
// Also at most max_key_rows key rows over all key heads (B x Hk x Lk).
struct DetLead {
  int64_t head_dim;
  bool causal;
  int64_t min_group, max_group;
  int64_t min_rows, max_rows = kNoBound;
  int64_t max_key_rows = kNoBound;
};
inline constexpr DetLead kFa3DetLeads[] = {{64, false, 1, 8, 512},
                                           {64, true, 1, 4, 1024},
                                           {64, true, 2, 16, 512, kNoBound, 131072},
                                           {128, false, 1, 1, 2048},
                                           {128, false, 2, 16, 512},
                                           {128, true, 1, 1, 2048},
                                           {128, true, 1, 1, 1024, 1024, 65536},
                                           {128, true, 2, 2, 512},
                                           {128, true, 4, 4, 512, kNoBound, 65536},
                                           {128, true, 4, 4, 512, 4096},
                                           {128, true, 8, 16, 512}};
// The first row of kFa3DetLeads that matches the problem (nullptr: none).
const DetLead* fa3_det_lead(const attention::Problem& p);
inline bool fa3_det_leads(const attention::Problem& p) {
  return fa3_det_lead(p) != nullptr;
}
// A range of Lq = Lk problems, causal unless its table says unmasked (kFa3DetRising,
// kFa3BwdFallingPicks, kFa3BwdDeterministicPicks, kFa3BwdDeterministicUnmaskedPicks): a head dim,
// min_group to max_group query heads a key head, min_rows to max_rows rows, min_key_rows to
// max_key_rows key rows (B x Hk x Lk).
struct SquareRows {
  int64_t head_dim;
  int64_t min_group, max_group;
  int64_t min_rows, max_rows = kNoBound;
  int64_t max_key_rows = kNoBound;
  int64_t min_key_rows = 0;
};
// Where the deterministic split runs in its rising order (the ranked deterministic entry; by name
// fa3_bwd_sm90a_deterministic_heavy_first): causal, Lq = Lk, a row's head dim, group range, from
// min_rows and at most max_key_rows key rows. Measured (H200, eightieth session's call 2,
// interleaved rounds, TFLOP/s rising / falling, 16k tokens unless named): d128 in groups of 2
// L2048 427.1 / 402.1, L16384 571.4 / 521.2 (L1024 274.0 / 333.4); at 4k tokens in groups of 2
// from L512 199.6 / 177.3; in groups of 4 L1024 317.6 / 313.4, L4096 498.1 / 437.9 (L512 218.5 /
// 232.8); of 8 / 16 from L512 (243.9 / 214.7, 234.7 / 215.8; L16384 528.4 / 416.8, 531.1 /
// 385.9); ungrouped L8192 525.6 / 495.4 (L2048 310.6 / 404.5); 64k tokens in groups of 8 / 16
// from L8192 (L16384 490.2 / 441.4, 486.9 / 395.2; L2048 348.0 / 404.0, 370.1 / 393.5); d64 in
// groups of 4 from L2048 (351.1 / 314.5; L512 198.1 / 200.9), of 16 from L512 (217.5 / 187.4).
// Ungrouped at 4k tokens from L1024 (the eighty-second session's call 3, the eighty-third's call
// 1: rising / the ranked deterministic entry, falling there): L2048 387.2 / 347.6, 386.1 / 345.5;
// L4096 466.3 / 408.1, 461.1 / 404.4 (L1024 283.3, 287.8; L512 181.5 / 188.0, 182.8 / 186.6).
inline constexpr SquareRows kFa3DetRising[] = {{64, 4, 4, 2048},
                                               {64, 8, 16, 512},
                                               {128, 1, 1, 8192},
                                               {128, 1, 1, 1024, 4096, 65536},
                                               {128, 2, 2, 512, kNoBound, 32768},
                                               {128, 2, 2, 2048, kNoBound, 131072},
                                               {128, 4, 4, 1024, kNoBound, 65536},
                                               {128, 8, 16, 512, kNoBound, 32768},
                                               {128, 8, 16, 8192}};
bool fa3_det_rising(const attention::Problem& p);
// The default backward in GQA groups, where the table's Lq = Lk points (one query head a key head)
// mislead: a kGroupedBackwardPicks row that matches the problem decides between fa3 and cuDNN in
// place of the table (where its candidate runs). bf16 or f16, Dk = Dv = head_dim, no soft-capping,
// padded, Lq = Lk from min_rows to max_rows, no mask or causal, at least min_group query heads a
// key head and at most max_key_rows key rows over all key heads (B x Hk x Lk). Measured (H200,
// bf16, TFLOP/s fa3 / cuDNN by name in one process, after 959fbbe's walk rotation; 16k tokens as B
// x L unless named; hidden 2048: 16 query heads at d128, 32 at d64; seventy-seventh session's
// calls 3-5):
// - d128 unmasked, fa3 from L512 in groups of 2 to 16 at 4k, 16k and 64k tokens: 1.00-1.30x (in
//   groups of 4 / 8 / 16 at 16k, L512 396.6 / 321.2, 407.6 / 321.8, 416.6 / 322.8; L1024, where
//   the table has cuDNN, 483.7 / 429.4, 496.1 / 430.8, 504.0 / 431.4; L2048 551.3 / 512.7, 552.0
//   / 513.1, 554.6 / 514.0; L16384 563.6 / 541.9, 563.6 / 542.0, 560.3 / 534.4; at 4k tokens in
//   groups of 2 L512 335.7 / 271.6, L4096 569.6 / 537.3; at 64k in groups of 16 L1024 478.5 /
//   413.9, L16384 550.4 / 534.0).
// - d128 causal in groups of 2 to 16 from L512, fa3 with its walks split over the group's heads
//   (fa3_bwd_sm90a_head_split's rule, the ranked entry's since the seventy-eighth session): at 16k
//   tokens, rows timed in interleaved rounds (call 4, fa3 ranked / cuDNN): groups of 2 L512 237.3 /
//   189.9, L2048 (the table: cuDNN) 422.5 / 390.1, L8192 486.3 / 489.1, L16384 544.8 / 521.8; of 4
//   L2048 380.0 / 377.2, L4096 435.2 / 443.8, L8192 529.1 / 481.6; of 8 L512 192.7 / 195.3, L1024
//   299.8 / 296.9, L2048 413.4 / 383.5, L4096 501.6 / 446.9, L8192 531.6 / 470.2, L16384 505.7 /
//   498.2; of 16 L512 186.1 / 195.5, L1024 307.5 / 296.7, L4096 527.3 / 463.6, L16384 552.0 /
//   500.6; at 4k tokens in groups of 4 / 8 L4096 469.7 / 386.6 and 507.0 / 387.7 (L1024 230.9 /
//   235.8, 222.4 / 236.6); at 64k in groups of 8 1.01-1.06x from L1024 to L8192, L16384 489.6 /
//   522.2. Before the split cuDNN led from L1024 in groups of 8 or more (fa3 0.39-0.84x) and
//   with at most 32k key rows from L2048 (4k tokens, groups of 4 L4096 0.75x).
// - d64 causal: the table's picks in any group (fa3; in groups of 16 from L2048 to L8192 fa3
//   split 372.1 / 316.3, 455.2 / 369.6, 483.9 / 387.9, where cuDNN led the unsplit kernel).
// - d128 causal in groups of 16 at L16384 from 64k key rows (64k tokens): cuDNN, 1.07x fa3's best
//   walk in the eighty-first session (507.4 against 473.7 / 477.0 rising; 0.96x and 0.89x in the
//   seventy-ninth and eightieth), where the deterministic preference keeps fa3's deterministic
//   split (kFa3DetAhead fits under cuDNN's table points too). At least min_key_rows key rows.
//   In groups of 8 there too (eighty-third session's call 2, 522.9 against fa3's ranked 501.6; the
//   eighty-second's calls 3 / 4 1.05-1.07x; the seventy-seventh's 522.2 / 489.6 above; 0.98x in
//   the eighty-first and 0.98-1.00x in the eightieth), the deterministic preference fa3's split
//   (501.0 against cuDNN's deterministic 459.0).
struct GroupedBackwardPick {
  int64_t head_dim;
  bool causal;
  int64_t min_group;
  int64_t min_rows, max_rows;
  int64_t max_key_rows;
  Candidate pick;
  int64_t min_key_rows = 0;
};
inline constexpr GroupedBackwardPick kGroupedBackwardPicks[] = {
    {128, true, 8, 16384, 16384, kNoBound, Candidate::cudnn, 65536},
    {128, false, 2, 512, kNoBound, kNoBound, Candidate::fa3},
    {128, true, 2, 512, kNoBound, kNoBound, Candidate::fa3}};
// The first row of kGroupedBackwardPicks that matches the problem; none outside them.
std::optional<Candidate> grouped_backward_pick(const attention::Problem& p);
// Where fa3's ranked backward entry walks as fa3_bwd_sm90a_falling does (its split grid key block
// first, each CTA's walks query block major from the last) in place of fa3_bwd_grid's schedule:
// causal, Lq = Lk, bf16 / f16 as kGroupedBackwardPicks, a row's head dim, group range and length
// range, at most max_key_rows key rows (B x Hk x Lk). Measured (H200, eightieth session's call 2,
// interleaved rounds, TFLOP/s falling / the ranked entry before): d128 causal at 4k tokens in
// groups of 4 L1024 283.0 / 239.8, L2048 398.0 / 358.8, L4096 500.9 / 466.4 (L512 178.8 / 184.9);
// of 8 L1024 285.7 / 246.0, L2048 407.3 / 368.4, L4096 508.6 / 504.2; d64 causal at 16k tokens in
// groups of 4 L2048 402.2 / 371.3, L4096 455.4 / 408.1, L8192 492.8 / 464.4 (L1024 0.87x, L16384
// 0.99x); of 16 L512 231.2 / 218.2, L1024 321.6 / 295.5, L2048 392.8 / 371.7 (from L4096
// 1.00x). Elsewhere within 0.96-1.03x or behind (0.75-0.90x: ungrouped up to L2048, 64k tokens,
// groups of 2 up to L1024).
inline constexpr SquareRows kFa3BwdFallingPicks[] = {
    {128, 4, 8, 1024, 4096, 16384}, {64, 4, 4, 2048, 8192, 131072}, {64, 16, 16, 512, 2048, 32768}};
bool fa3_bwd_falls(const attention::Problem& p);
// The deterministic split as the default backward (kFa3BwdDeterministicAhead): where its rising
// order ran ahead of the ranked entry in each of the eightieth session's three calls (H200,
// interleaved rounds, TFLOP/s rising / ranked, calls 1 / 2 / 3): d128 causal at 16k tokens in
// groups of 8 at L512 240.7 / 212.3, 243.9 / 215.0, 243.7 / 214.5 and L1024 340.7 / 313.5, 339.9 /
// 311.6, 339.8 / 311.2; of 16 at L512 233.1 / 208.2, 234.7 / 210.4, 235.8 / 211.0 and L1024 331.2 /
// 317.3, 330.9 / 314.6, 331.8 / 316.3; of 4 at L2048 428.7 / 392.7, 435.6 / 388.0, 427.8 / 380.9
// and L4096 516.2 / 472.1, 498.1 / 465.4, 499.2 / 455.5; of 2 at L4096 / L8192 (calls 2 / 3)
// 508.1 / 457.0, 503.9 / 450.2 and 546.3 / 505.6, 541.1 / 501.4; of 16 at L8192 / L16384 556.5 /
// 507.9, 524.5 / 489.0, 524.4 / 508.3 and 581.9 / 517.5, 531.1 / 509.4, 540.0 / 508.5. Not at 4k
// tokens (0.89-1.05x: min_key_rows) nor at 64k (0.84-0.97x: max_key_rows). A deterministic default
// there costs nothing: precision_guarantee() says so. Eighty-first session (calls 1, 2, 4 with the
// eightieth's calls 2 / 3): the default there ran 1.04-1.13x the ranked entry in the same rounds
// (groups of 8 at L512 242.4 / 214.9, in f16 242.8 / 215.6); also ahead in each of three calls,
// hence the two single-point rows: groups of 4 at L512 (the falling split, not rising there)
// 232.9 / 220.7, 232.8 / 221.7, 232.8 / 221.5; of 8 at L2048 (rising) 416.7 / 397.1, in f16 421.0
// / 399.5, 409.1 / 387.9 by name. Not at d64 (0.80-1.00x the ranked entry in groups of 2-16), nor
// groups of 4 at L1024 (1.02-1.03x, within the spread).
// Eighty-second session, after a788e1d (the split's prep no longer zeroes the f32 dQ accumulator:
// 1.13x to 1.25x the ranked entry in groups of 8 at L512), calls 2 / 3 (two processes in call 3),
// TFLOP/s the split as the ranked deterministic entry / the ranked entry (cuDNN where the table
// picks it): groups of 2 at L512 256.1 / 236.0, 257.8 / 236.4, L1024 342.7 / 327.3, 344.3 /
// 329.4, L2048 444.9 / 417.8, 431.6 / 383.8; of 4 at L1024 336.0 / 308.4, 336.7 / 308.1, 337.9 /
// 309.9; ungrouped at L2048 over cuDNN 439.0 / 419.0, 437.0 / 411.9 (429.4 / 419.0 in a third
// process) and L8192 533.5 / 505.8, 524.4 / 501.2, 522.2 / 491.6; at 64k tokens in groups of 8 /
// 16 (the falling split) L512 273.3 / 224.2, 262.8 / 215.2 and L1024 332.0 / 304.3, 318.2 /
// 301.2 (320.6 rising); at 4k tokens in groups of 8 / 16 at L512 190.7 / 172.5, 191.6 / 176.1.
// Within 1.03x or behind: groups of 2 at L16384 (1.02x), of 4 from L8192 (1.02-1.03x), of 8 from
// L4096 (0.98-1.02x), of 16 at L2048 / L4096 (1.01-1.02x, 0.95x), ungrouped L4096 (0.93-1.03x),
// L16384 (0.98x), 4k tokens from L1024 in groups, d64 (0.80-0.95x, but groups of 16 at L512 1.02x).
// Ungrouped at 4k tokens from L1024, rising since it has a kFa3DetRising row (TFLOP/s rising by
// name / the default then, the eighty-second session's call 3 and the eighty-third's call 1):
// L1024 283.3 / 266.1, 287.8 / 267.3; L2048 (the table: cuDNN) 387.2 / 333.6, 386.1 / 334.5; L4096
// 466.3 / 414.9, 461.1 / 414.2 (1.07-1.16x).
// 64k tokens in groups of 2 / 4 (eighty-fourth session, call 2 by name, call 3 two processes the
// default itself; falling there: TFLOP/s the split / the ranked entry): groups of 2 L512 281.7 /
// 256.6, 286.7 / 261.2, 281.9 / 257.9, L1024 369.8 / 351.1, 377.5 / 356.4, 374.2 / 355.0, L2048
// (the ranked deterministic entry; call 4 the default) 442.9 / 430.9, 448.6 / 434.3, 446.8 /
// 434.1, 439.0 / 430.8; of 4 L512 293.0 / 247.3, 292.1 / 245.9, 291.3 / 245.9, L1024 369.5 /
// 353.1, 373.8 / 353.3, 372.8 / 353.0. Not groups of 2 at L4096 (1.01-1.03x), of 4 at L2048
// (1.01x) nor L4096 (0.98x). Ungrouped at 64k tokens L2048, over cuDNN (the table's pick there;
// the eighty-fourth session's calls 2 / 4, the ranked deterministic entry / cuDNN): 421.9 / 407.9,
// 419.6 / 404.4, and the default itself in the eighty-fifth's call 1 426.4 / 410.9 (L4096 1.02x
// fa3's ranked entry, left).
// 32k tokens, causal in groups of 2 at L1024 and of 4 at L512 / L1024 (the eighty-fifth session's
// calls 1-3, three processes, falling there; TFLOP/s the ranked deterministic entry / the ranked
// entry, in calls 2 / 3 with its first-store adds, BwdParams::claims): groups of 2 L1024 380.2 /
// 357.1, 379.1 / 367.6, 377.8 / 367.8; of 4 L512 277.8 / 236.8, 279.7 / 267.5, 278.5 / 266.3 and
// L1024 357.8 / 338.7, 369.0 / 352.5, 360.2 / 352.6 (_head_split by name 367.7, 369.2, 367.8).
// Not groups of 2 at L512 (276.8 / 252.8, then against the first-store adds 276.7 / 273.9, 275.2 /
// 272.5: a tie).
inline constexpr SquareRows kFa3BwdDeterministicPicks[] = {
    {128, 8, 16, 512, 1024, 131072, 16384},  {128, 8, 16, 512, 512, 8192, 4096},
    {128, 8, 8, 2048, 2048, 32768, 32768},   {128, 4, 4, 512, 4096, 65536, 65536},
    {128, 2, 2, 512, 8192, 131072, 131072},  {128, 16, 16, 8192, 16384, 16384, 16384},
    {128, 1, 1, 2048, 2048, 262144, 262144}, {128, 1, 1, 8192, 8192, 262144, 262144},
    {128, 1, 1, 1024, 4096, 65536, 65536},   {128, 2, 2, 512, 2048, 524288, 524288},
    {128, 4, 4, 512, 1024, 262144, 131072},  {128, 1, 1, 2048, 2048, 1048576, 1048576},
    {128, 2, 2, 1024, 1024, 262144, 262144}};
// The same with no mask, the split's walks rotated as the ranked entry's (eighty-third session,
// calls 1 / 2 / 3, three processes, interleaved rounds, TFLOP/s the ranked deterministic entry (the
// default in call 3) / the ranked entry, d128 at 16k tokens): groups of 4 at L512 416.2 / 394.9,
// 419.9 / 395.3, 418.3 / 395.8; of 8 at L512 433.3 / 404.2, 436.6 / 408.0, 437.2 / 408.3 and L1024
// 511.8 / 495.4, 516.2 / 498.2, 515.9 / 499.8; of 16 at L512 441.2 / 414.2, 447.1 / 416.1, 445.5 /
// 416.1 and L1024 522.5 / 503.9, 522.3 / 504.2, 521.1 / 502.5. Not groups of 4 at L1024
// (1.02-1.03x), of 2 at L512 (1.02x, one process), from L2048 (0.90-1.02x), ungrouped (at L512 the
// split's 341.0 in kFa3DetLeads' notes, the ranked entry's 352.6 in call 1), nor at 4k tokens
// (1.01-1.02x in groups of 4 / 8 / 16 at L512 / L1024, eighty-fourth session's call 1).
// At 64k tokens (eighty-fourth session, call 1 / call 2's two processes, the default itself in
// call 2): groups of 8 at L512 453.9 / 420.1, 433.9 / 408.5, 430.6 / 406.0 and L1024 481.3 /
// 466.6, 488.6 / 475.9, 484.7 / 470.9; of 16 at L512 463.1 / 425.5, 434.0 / 411.8, 434.9 / 410.9
// and L1024 485.1 / 471.6, 490.9 / 479.2, 492.8 / 478.7 (1.02-1.09x). Not groups of 4 there (L512
// 422.1 / 401.4, then 415.5 / 413.8, 407.9 / 413.9; L1024 1.02x). Groups of 4 / 8 / 16 at 32k
// tokens L512 (call 2, once): 432.3 / 406.9, 450.4 / 418.1, 459.3 / 424.8.
inline constexpr SquareRows kFa3BwdDeterministicUnmaskedPicks[] = {
    {128, 4, 4, 512, 512, 65536, 65536},
    {128, 8, 8, 512, 1024, 131072, 32768},
    {128, 16, 16, 512, 1024, 65536, 16384}};
// kFa3BwdDeterministicPicks' causal rows or kFa3BwdDeterministicUnmaskedPicks' unmasked ones.
bool fa3_bwd_deterministic_default(const attention::Problem& p);
// cuDNN's deterministic algorithm as the default backward (cudnn_sdpa_bwd_deterministic_default, at
// kCudnnDetDefaultAhead: above fa3's ranked-ahead entry and cuDNN's non-deterministic one) where
// these rows say and fa3 would run (measured against fa3's ranked entry, on the H200). Measured
// (eighty-second session, calls 2-4, four processes, interleaved rounds, TFLOP/s cuDNN's
// deterministic algorithm / fa3's ranked entry, the default then / cuDNN's default algorithm):
// d128 causal ungrouped L512 at 16k tokens 246.3 / 221.8 / 212.9, 247.3 / 222.2 / 215.2, 246.2 /
// 220.9 / 212.5, 247.1 / 221.3 / 214.3 (1.11-1.12x). Not at L1024 (1.01x), at 4k tokens (1.02x),
// unmasked (0.98-1.00x), d64 (0.97x) nor in groups (fa3's split leads there). At 64k tokens
// (eighty-fourth session, call 2 by name, call 3 two processes, the default itself at L512) L512
// 267.4 / 230.1, 266.2 / 233.6, 266.3 / 233.6 (fa3's split 246.8-247.3, cuDNN's default
// 225.5-226.5) and L1024 341.4 / 328.6, 346.0 / 333.5, 343.9 / 329.0, in call 4 the default
// 338.3 / 325.6 (fa3's split 341.7, 346.7, 346.3, 336.6: a tie, and kFa3DetLeads has no row
// there).
inline constexpr SquareRows kCudnnBwdDeterministicPicks[] = {
    {128, 1, 1, 512, 512, 1048576, 262144}, {128, 1, 1, 1024, 1024, 1048576, 1048576}};
bool cudnn_bwd_deterministic_default(const attention::Problem& p);
inline constexpr std::string_view kCudnnBwdDeterministicDefault =
    "cudnn_sdpa_bwd_deterministic_default";
inline constexpr int kCudnnDetDefaultAhead = kFa3DetDefaultAhead + 1;
// fa3's backward: how many CTAs share each key block's walk over the group's query heads
// (fa3_backward.cuh, BwdParams::head_parts; the ranked entry and fa3_bwd_sm90a_head_split), for a
// kernel of `keys` keys a CTA and `q_rows` query rows a step on sm_count SMs. A power of two
// dividing the group, at most 8, by the grid's time in steps under a list schedule (the CTAs in
// launch order, each to the SM that frees first): a CTA takes its walk's steps plus
// kFa3BwdCtaSteps (its K / V load, the ring's fill and drain), a split one kFa3BwdSplitCtaSteps
// (also its f32 shares' round trip through DRAM); each doubling taken only for a grid
// kFa3BwdSplitMargin as long. The model sees the walks' lengths only: a causal problem's longest
// walks, a whole group's rows, outlast a wave or two (d128 causal in groups of 16, 16k tokens:
// unsplit fa3 at 0.49-0.57x its MHA speed, H200). With 8 waves or more the tail is a small share:
// 1; also 1 for MHA, varlen and head dims above 128 (not served). Memoized, 16 problems a thread:
// run() asks each launch. The split's costs are fitted on every split of 30 causal d128 points
// (H200, seventy-ninth session's call 1, rows in interleaved rounds, `_x2` / `_x4` / `_x8` by
// name): with 4 steps and a 2% margin the model's parts ran within 3% of the best split at all
// 30 (summed shortfall 9%; with the earlier 8 steps and 3%, 57%, seven points 5-12% behind: groups
// of 8 / 16 at L512 / L1024, 4k tokens in groups of 8 at L1024), and it keeps the 64k-token groups
// of 8 at L16384 whole (2 parts ran 0.89x there).
// The same model times the unsplit grid taken key block first (heavy_first: every (batch, key
// head)'s longest walks in the first wave; the walks stay whole) and takes it where it is
// kFa3BwdHeavyFirstGain times shorter than the best split in launch order. Measured (H200,
// seventy-eighth and seventy-ninth sessions, interleaved rounds): where that gain is 1.30-1.48
// heavy first ran 1.0-1.41x the best split (4k tokens in groups of 2 at L512-L4096, groups of 8
// at L512, d64 in groups of 16 at L512); every point below 1.3 that it lost (0.77-0.96x: groups of
// 4 at L512, of 8 / 16 from L1024, 4k tokens in groups of 8 at L1024; and 64k tokens, where its
// wave reads more heads' Q / dY than L2 holds) modelled 1.25 or less.
// Where every query head's Q and dY fit in l2_bytes (a wave taken key block first reads them from
// many heads at once: from L2 then, not DRAM), the split grid itself is taken key block first
// where that models kFa3BwdResidentHeavyFirstGain times shorter. Measured (H200, 60 MiB of L2,
// seventy-ninth session's call 2, interleaved rounds, by name): at 4k tokens (Q and dY 32 MiB)
// every point of gain 1.12-1.15 ran 1.00-1.12x the split alone (groups of 4 at L1024 / L2048,
// groups of 8 at L1024, d64 in groups of 8 at L1024 / L2048), those of gain 1.0 0.98-1.0x; at 16k
// / 64k tokens (128 / 512 MiB) points of gain 1.05-1.17 ran 0.72-1.06x.
inline constexpr double kFa3BwdCtaSteps = 3, kFa3BwdSplitCtaSteps = 4, kFa3BwdSplitMargin = 0.98,
                        kFa3BwdHeavyFirstGain = 1.28, kFa3BwdResidentHeavyFirstGain = 1.1;
// split: the best split with the grid in launch order (the split entries by name, the
// deterministic instance); parts and heavy_first: the ranked entry's grid (parts 1 where heavy
// first keeps the walks whole, else split).
struct Fa3BwdGrid {
  int parts = 1;
  bool heavy_first = false;
  int split = 1;
  int split_heavy_first = 1;  // the best split of the grid taken key block first
};
Fa3BwdGrid fa3_bwd_grid(const attention::Problem& p, int sm_count, int keys, int q_rows,
                        int64_t l2_bytes);
// The best split in launch order (Fa3BwdGrid::split; it does not depend on the L2).
inline int fa3_bwd_head_parts(const attention::Problem& p, int sm_count, int keys, int q_rows) {
  return fa3_bwd_grid(p, sm_count, keys, q_rows, 0).split;
}
// The deterministic instance's split (fa3_bwd_sm90a_deterministic_head_split and the ranked
// deterministic entry): its ordered dQ adds make a CTA wait at a chunk until the chunk's previous
// adder (the next higher key block, an earlier ticket) has counted its add, so the split that
// balances the grid in launch order (fa3_bwd_grid) can leave the last key heads' longest walks,
// the last tickets, waiting in the tail. Where the walks do not rotate (a band or causal mask), the
// same list schedule with those waits decides (a CTA's adds count as it issues its next step);
// rotated walks (no mask) take fa3_bwd_grid's split. A discrete-event Python model of the same
// (seventy-ninth session) put the deterministic split at 0.63-0.78x the default split in causal
// groups of 4-16 from L4096 at 16k tokens, as measured there (0.66-0.82x), and finds more parts
// better there (groups of 16 at L8192: 8 parts 1.39x the 2 that fa3_bwd_grid gives). Memoized, 16
// problems a thread.
// rising: fa3_bwd_sm90a_deterministic_heavy_first's order (tickets rising through the key blocks,
// walks query block major from the last).
int fa3_bwd_det_parts(const attention::Problem& p, int sm_count, int keys, int q_rows, bool rotated,
                      bool rising = false);
// Head dim 64 without soft-capping from kFa3BwdWideMinRows query rows on, where fa3's backward
// runs: the 128-row steps in place of the 64-row ones. Measured (H200, bf16, 16k tokens as B x L,
// 32 heads, fifty-fifth session's call 1, medians of 3 runs, TFLOP/s of the kernel fa3 ran
// before (64-row steps: two warpgroups below L2048, three from it) -> 128-row steps (cuDNN)):
// L512 236.3 -> 255.3 (276.9), L1024 306.4 -> 333.3 (371.2), L2048 360.9 -> 388.7 (425.8),
// L4096 393.4 -> 429.6 (433.1), L8192 423.9 -> 430.6 (444.1), L16384 419.7 -> 460.5 (455.6);
// causal 148.7 / 220.8 / 299.9 / 351.9 / 391.1 / 415.2 -> 157.3 / 237.8 / 315.1 / 376.6 / 420.8 /
// 417.6 (169.3 / 250.3 / 327.9 / 386.7 / 409.6 / 434.1). Shorter (call 5, one run, 64-row ->
// 128-row steps): L256 176.3 -> 189.5 (causal 98.6 -> 103.3), L128 109.0 -> 109.9 (54.0 -> 54.9),
// a tie; below 256 rows a sequence of more than one step pads up to 127 rows more.
inline constexpr int64_t kFa3BwdWideMinRows = 256;
bool fa3_bwd_widens(const attention::Problem& p);
// The kernel kFa3BwdRankedAhead launches for a problem, as the name that pins it.
std::string_view fa3_ranked_backward_kernel(const attention::Problem& p);

// ---- Launch-time rules of the cuDNN kernels -----------------------------------------------------
// cuDNN reads 16-byte vectors: every Q/K/V/Y/dY/dQ/dK/dV pointer 16-byte aligned and every
// non-unit stride a multiple of 16 bytes; LSE 4-byte aligned with unit-stride rows. Errors name op,
// argument and rule.
template <class Ptr>
Status cudnn_check_layout(std::string_view op, std::string_view arg, const BasicTensor<Ptr>& t,
                          bool is_lse);

}  // namespace baracuda::attention_hopper

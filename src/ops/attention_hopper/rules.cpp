// Host-side rules of the cuDNN attention backend and the fa3 kernels: what cuDNN can take, which
// candidate the measured table prefers, and the layout rules checked before a launch. No CUDA or
// cuDNN here, so the CPU build tests all of it.
#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "baracuda/ops/attention_hopper.hpp"
#include "ops/attention/common.hpp"
#include "ops/attention_hopper/selection_table.hpp"

namespace baracuda::attention_hopper {
namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

}  // namespace

std::optional<std::string> cudnn_screen(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  if (d.dtype != DType::bf16 && d.dtype != DType::f16)
    return "dtype=" + std::string(name(d.dtype)) + ": cuDNN SDPA takes bf16 or f16";
  // Packed sequences: cuDNN's ragged layout (the backward with cudnn_sdpa.cpp's own rules: dense
  // tensors, head dims up to 128). Not with key counts: a sequence's rows past its count are
  // inside the packed range (see below).
  if (d.varlen && d.seqused_k)
    return "varlen with seqused_k: cuDNN's padding mask would multiply each sequence's rows past "
           "its count into P V";
  // Key counts as cuDNN's padding mask were wired and measured (H200, cuDNN 9.19, 2026-12-02,
  // eighty-ninth session; the rows that see no key written by a pass after it): the mask scores
  // none of a cache's rows past a count but still multiplies their zero probabilities into P V, so
  // one NaN there (those rows may hold anything: an engine's cache is filled in place) makes NaN of
  // every row of each query tile that reaches that key tile. Nor was it faster: 0.71-0.83x fa3's
  // counted forward on the bench's chunked-prefill rows, 0.66x the decode kernel on ragged decodes.
  if (d.seqused_k)
    return "seqused_k: cuDNN's padding mask multiplies a cache's rows past each count into P V "
           "(0 x NaN), and those rows may hold anything";
  if (d.page_size > 0) return "page_size: paged K / V are not wired to cuDNN";
  if (d.softcap > 0) return "softcap: cuDNN SDPA has no logit soft-capping";
  if (d.head_dim_qk % 8 != 0 || d.head_dim_v % 8 != 0)
    return "head_dim_qk=" + num(d.head_dim_qk) + ", head_dim_v=" + num(d.head_dim_v) +
           ": cuDNN needs multiples of 8";
  if (d.batch == 0 || d.heads_q == 0 || d.len_q == 0 || d.len_k == 0)
    return "empty problem (batch=" + num(d.batch) + ", heads_q=" + num(d.heads_q) +
           ", len_q=" + num(d.len_q) + ", len_k=" + num(d.len_k) + "): nothing for cuDNN to do";
  // cuDNN's windows need a right bound (its left bound is only defined with causal-like masking).
  if (d.mask.left >= 0 && d.mask.right < 0)
    return "mask=" + attention::to_string(d.mask) + ": cuDNN needs a right bound with a left bound";
  // Rows that see no key must give y = 0, lse = -inf; cuDNN does not promise that. The visible
  // band's ends move monotonically with the row, so only the first and last rows can be empty.
  // Packed sequences: a pass after cuDNN's writes every row that sees no key (cudnn_varlen.hpp).
  if (d.varlen) return std::nullopt;
  const attention::detail::Band band = attention::detail::band_of(d.mask);
  for (int64_t i : {int64_t{0}, d.len_q - 1}) {
    int64_t lo = 0, hi = 0;
    attention::detail::visible_keys(band, i, d.len_q, d.len_k, &lo, &hi);
    if (lo >= hi)
      return "mask=" + attention::to_string(d.mask) + " with len_q=" + num(d.len_q) +
             ", len_k=" + num(d.len_k) + ": query row " + num(i) +
             " sees no key (cuDNN does not define such rows)";
  }
  return std::nullopt;
}

namespace {
// The cuDNN tuning mode in effect (set_cudnn_tuning_mode, CudnnTuningScope).
std::atomic<CudnnTuningMode> g_tuning_mode{CudnnTuningMode::by_size};
// The override in effect (null: the shipped table). Set and restored by SelectionTableOverride.
std::atomic<const std::span<const TablePoint>*> g_override{nullptr};
}  // namespace

void set_cudnn_tuning_mode(CudnnTuningMode mode) {
  g_tuning_mode.store(mode);
}
CudnnTuningMode cudnn_tuning_mode() {
  return g_tuning_mode.load();
}
CudnnTuningScope::CudnnTuningScope(CudnnTuningMode mode)
    : previous_(g_tuning_mode.exchange(mode)) {}
CudnnTuningScope::~CudnnTuningScope() {
  g_tuning_mode.store(previous_);
}

bool cudnn_tunes(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  const CudnnTuningMode mode = g_tuning_mode.load();
  // Not packed sequences: the tuning's scratch tensors are padded ones.
  if (mode == CudnnTuningMode::off || d.varlen || cudnn_screen(p).has_value() ||
      d.len_q > kCudnnTuneMaxArea / d.len_k)
    return false;
  const double b = static_cast<double>(d.batch), hq = static_cast<double>(d.heads_q),
               hk = static_cast<double>(d.heads_kv), lq = static_cast<double>(d.len_q),
               lk = static_cast<double>(d.len_k), dk = static_cast<double>(d.head_dim_qk),
               dv = static_cast<double>(d.head_dim_v);
  const double flops = 4.0 * b * hq * lq * lk * dk * (d.mask.is_causal() ? 0.5 : 1.0);
  if (mode == CudnnTuningMode::by_size && flops < kCudnnTuneMinFlops) return false;
  // The backward's scratch (the larger pass): Q, dQ, Y, dY, K, dK, V, dV in 16 bits, LSE in f32;
  // each configuration's own workspace is checked once they are built.
  const double bytes =
      2.0 * b * (hq * lq * (2 * dk + 2 * dv) + hk * lk * (2 * dk + 2 * dv)) + 4.0 * b * hq * lq;
  return bytes <= static_cast<double>(kCudnnTuneScratchBytes);
}

#if !BARACUDA_HAVE_CUDNN_FRONTEND
std::optional<CudnnTuning> cudnn_tuning(const attention::Problem&, Pass, bool, int) {
  return std::nullopt;
}
bool cudnn_serves(const attention::Problem&, const DeviceCaps&) {
  return false;
}
std::optional<int64_t> cudnn_loaded_version() {
  return std::nullopt;
}
#endif

SelectionTableOverride::SelectionTableOverride(std::span<const TablePoint> table)
    : table_(table), previous_(g_override.exchange(&table_)) {}
SelectionTableOverride::~SelectionTableOverride() {
  g_override.store(previous_);
}

std::span<const TablePoint> selection_table() {
  const std::span<const TablePoint>* o = g_override.load();
  return o ? *o : detail::kSelectionTable;
}
std::string_view selection_table_provenance() {
  return detail::kSelectionProvenance;
}

std::string_view to_string(Candidate c) {
  switch (c) {
    case Candidate::cudnn:
      return "cudnn";
    case Candidate::bespoke:
      return "bespoke";
    case Candidate::fa3:
      return "fa3";
  }
  return "?";
}

int64_t fa3_packed_chunk_rows(int64_t head_dim, int64_t len_k) {
  switch (head_dim) {
    case 64:
      return kFa3PackedChunkRowsD64;
    case 128:
      return len_k >= kFa3PackedLongCacheKeys ? kFa3PackedLongCacheRows : kFa3PackedChunkRows;
    case 256:
      return kFa3PackedChunkRowsD256;
    default:
      return 0;
  }
}

int64_t fa3_chunk_rows_over_bespoke(int64_t head_dim, int64_t len_k) {
  return head_dim <= 64 && len_k > kFa3ChunkLongCacheKeysD64 ? kFa3ChunkRowsOverBespokeD64LongCache
                                                             : kFa3ChunkRowsOverBespoke;
}

bool wide_head_decode(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  return p.group == 1 && d.len_q <= kDecodeQueryRows && d.len_q < d.len_k && d.head_dim_qk == 256 &&
         d.head_dim_v == 256 && (d.dtype == DType::bf16 || d.dtype == DType::f16);
}

bool fa3_packs(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  if ((d.dtype != DType::bf16 && d.dtype != DType::f16) || d.head_dim_qk != d.head_dim_v ||
      p.group < 2 || p.group > 16 || (p.group & (p.group - 1)) != 0 || d.len_q >= d.len_k ||
      d.len_q > fa3_packed_chunk_rows(d.head_dim_qk, d.len_k))
    return false;
  if (d.len_q > kDecodeQueryRows) return true;
  // Decode-shaped: see kFa3PackedDecodeRows.
  if (d.head_dim_qk == 256)
    return !(p.group == 16 && d.len_q == 1 &&
             d.batch * d.heads_kv * d.len_k < kFa3PackedD256SingleTokenKeyRows);
  const int64_t rows = p.group * d.len_q;
  if (rows < kFa3PackedTileRows && d.batch * d.heads_kv > kFa3PackedDecodeMaxKvHeads) return false;
  return rows > kFa3PackedDecodeRows ||
         (rows == kFa3PackedDecodeRows && d.len_q >= kFa3PackedDecodeMinLq);
}

namespace {
// What fa3's instance rules below were measured on: bf16 / f16, Dk = Dv = 64 or 128, padded
// tensors without key counts or pages.
bool measured_instance_shape(const attention::Descriptor& d) {
  return (d.dtype == DType::bf16 || d.dtype == DType::f16) &&
         fa3_persistent_dims(d.head_dim_qk, d.head_dim_v) && !d.varlen && !d.seqused_k &&
         d.page_size == 0;
}
}  // namespace

bool fa3_packs_ungrouped(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  return p.group == 1 && measured_instance_shape(d) && d.len_q > kDecodeQueryRows &&
         d.len_q <= kFa3PackedUngroupedMaxRows && d.len_k >= kFa3PackedLongCacheKeys;
}

bool fa3_persists(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  const int64_t longest = std::max(d.len_q, d.len_k);
  return measured_instance_shape(d) &&
         (longest <= kFa3PersistentMaxLen ||
          (d.head_dim_qk == 128 && d.mask.is_none() &&
           longest <= kFa3PersistentUnmaskedD128MaxLen) ||
          (d.mask.is_causal() && (longest <= kFa3PersistentCausalMaxLen ||
                                  (d.len_q > kFa3PersistentCausalMaxLen &&
                                   longest <= kFa3PersistentPairedCausalMaxLen))));
}

bool fa3_widens(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  return measured_instance_shape(d) && d.head_dim_qk == 64 && d.len_q >= kFa3WideMinRows;
}

std::string_view fa3_ranked_forward_kernel(const attention::Problem& p) {
  const bool paged = p.desc.page_size > 0;
  if (fa3_packs(p)) return paged ? kFa3PackedPagedKernel : kFa3PackedKernel;
  if (fa3_packs_ungrouped(p)) return kFa3PackedKernel;  // never paged
  if (fa3_persists(p)) return kFa3PersistentKernel;
  if (fa3_widens(p)) return kFa3WideKernel;
  return paged ? kFa3PagedKernel : p.desc.seqused_k ? kFa3CountsKernel : kFa3Kernel;
}

bool fa3_bwd_widens(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  return (d.dtype == DType::bf16 || d.dtype == DType::f16) && d.head_dim_qk == 64 &&
         d.head_dim_v == 64 && d.softcap <= 0 && d.len_q >= kFa3BwdWideMinRows;
}

namespace {
// What the backward's measured rows (kFa3DetLeads, kGroupedBackwardPicks, ...) were taken on: bf16
// / f16, Dk = Dv, no soft-capping, padded, no mask or causal (a backward has no pages or key
// counts).
bool measured_backward_shape(const attention::Descriptor& d) {
  return (d.dtype == DType::bf16 || d.dtype == DType::f16) && d.head_dim_v == d.head_dim_qk &&
         d.softcap <= 0 && !d.varlen && (d.mask.is_none() || d.mask.is_causal());
}
}  // namespace

namespace {
// Lq = Lk problems of the measured backward shape, and their key rows over all key heads (a
// validated problem's element counts fit in int64: "overflows int64" otherwise).
std::optional<int64_t> measured_key_rows(const attention::Descriptor& d) {
  if (!measured_backward_shape(d) || d.len_q != d.len_k) return std::nullopt;
  return d.batch * d.heads_kv * d.len_k;
}
}  // namespace

const DetLead* fa3_det_lead(const attention::Problem& p) {
  const attention::Descriptor& d = p.desc;
  if (!measured_backward_shape(d)) return nullptr;
  const bool causal = d.mask.is_causal();
  if (causal && d.len_q != d.len_k) return nullptr;
  const int64_t key_rows = d.batch * d.heads_kv * d.len_k;
  for (const DetLead& lead : kFa3DetLeads)
    if (lead.head_dim == d.head_dim_qk && lead.causal == causal && p.group >= lead.min_group &&
        p.group <= lead.max_group && d.len_q >= lead.min_rows && d.len_k >= lead.min_rows &&
        d.len_q <= lead.max_rows && d.len_k <= lead.max_rows && key_rows <= lead.max_key_rows)
      return &lead;
  return nullptr;
}

namespace {
// Causal rows where `causal`, else unmasked ones.
bool in_square_rows(const attention::Problem& p, std::span<const SquareRows> rows,
                    bool causal = true) {
  const std::optional<int64_t> key_rows = measured_key_rows(p.desc);
  if (!key_rows || p.desc.mask.is_causal() != causal) return false;
  for (const SquareRows& r : rows)
    if (r.head_dim == p.desc.head_dim_qk && p.group >= r.min_group && p.group <= r.max_group &&
        p.desc.len_q >= r.min_rows && p.desc.len_q <= r.max_rows && *key_rows <= r.max_key_rows &&
        *key_rows >= r.min_key_rows)
      return true;
  return false;
}
}  // namespace

bool fa3_det_rising(const attention::Problem& p) {
  return in_square_rows(p, kFa3DetRising);
}

bool fa3_bwd_falls(const attention::Problem& p) {
  return in_square_rows(p, kFa3BwdFallingPicks);
}

bool fa3_bwd_first_store(const attention::Problem& p) {
  return std::max(p.desc.len_q, p.desc.len_k) <= kFa3BwdFirstStoreMaxRows;
}

bool fa3_bwd_deterministic_default(const attention::Problem& p) {
  return in_square_rows(p, kFa3BwdDeterministicPicks) ||
         in_square_rows(p, kFa3BwdDeterministicUnmaskedPicks, false);
}

bool cudnn_bwd_deterministic_default(const attention::Problem& p) {
  return in_square_rows(p, kCudnnBwdDeterministicPicks);
}

std::optional<Candidate> grouped_backward_pick(const attention::Problem& p) {
  const std::optional<int64_t> key_rows = measured_key_rows(p.desc);
  if (!key_rows) return std::nullopt;
  const attention::Descriptor& d = p.desc;
  for (const GroupedBackwardPick& g : kGroupedBackwardPicks)
    if (g.head_dim == d.head_dim_qk && g.causal == d.mask.is_causal() && p.group >= g.min_group &&
        d.len_q >= g.min_rows && d.len_q <= g.max_rows && *key_rows <= g.max_key_rows &&
        *key_rows >= g.min_key_rows)
      return g.pick;
  return std::nullopt;
}

namespace {
// What the backward grid models see of a problem: its (batch, key head) pairs, its key blocks and
// the band's bounds (fa3_common.cuh's band rule: a bound that reaches every key is none, -1); no
// blocks where no model applies: varlen, head dims above 128, MHA, no SMs, or 8 waves of CTAs and
// more. Cheap (the models' memo keys); walk_spans has the walks themselves.
struct GridShape {
  int64_t pairs = 0, blocks = 0, left = -1, right = -1;
};
GridShape grid_shape(const attention::Problem& p, int sm_count, int keys, int q_rows) {
  const attention::Descriptor& d = p.desc;
  GridShape g;
  if (d.varlen || d.head_dim_qk > 128 || p.group < 2 || sm_count <= 0 || keys <= 0 || q_rows <= 0)
    return g;
  const int64_t blocks = (d.len_k + keys - 1) / keys, pairs = d.batch * d.heads_kv;
  if (pairs * blocks >= 8 * int64_t{sm_count}) return g;
  auto bound = [&](int64_t b) { return b < 0 || b >= d.len_q + d.len_k ? int64_t{-1} : b; };
  g.pairs = pairs, g.blocks = blocks;
  g.left = bound(d.mask.left), g.right = bound(d.mask.right);
  return g;
}
// Each key block's walk as the query blocks [begin, end) it visits (the kernels' m_begin and nm).
std::vector<std::pair<int64_t, int64_t>> walk_spans(const attention::Problem& p, const GridShape& g,
                                                    int keys, int q_rows) {
  const attention::Descriptor& d = p.desc;
  const int64_t off = d.mask.diagonal == attention::Diagonal::bottom_right ? d.len_k - d.len_q : 0;
  std::vector<std::pair<int64_t, int64_t>> spans(static_cast<size_t>(g.blocks));
  for (int64_t kb = 0; kb < g.blocks; ++kb) {
    const int64_t n0 = kb * keys,
                  begin = g.right >= 0 ? std::max<int64_t>(0, n0 - off - g.right) / q_rows : 0,
                  rows = g.left >= 0
                             ? std::min(d.len_q, std::max<int64_t>(0, n0 + keys - off + g.left))
                             : d.len_q;
    spans[static_cast<size_t>(kb)] = {begin, std::max(begin, (rows + q_rows - 1) / q_rows)};
  }
  return spans;
}

// The SMs under a list schedule: each CTA, in launch order, to the SM that frees first.
class ListSchedule {
 public:
  explicit ListSchedule(int sm_count)
      : free_at_(std::greater<double>{}, std::vector<double>(static_cast<size_t>(sm_count), 0.0)) {}
  // The time the next CTA starts (its SM taken until finish()).
  double start() {
    const double t = free_at_.top();
    free_at_.pop();
    return t;
  }
  void finish(double t) {
    free_at_.push(t);
    end_ = std::max(end_, t);
  }
  double end() const { return end_; }

 private:
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at_;
  double end_ = 0;
};

// A grid model's recent answers, keyed by what it reads of a problem (thread_local at each use).
// run() asks a model at every launch, and a training step cycles through a few attention shapes:
// with one remembered answer every change of shape ran the list schedule again, up to 0.8 ms of
// host time for fa3_bwd_grid and 9 ms for fa3_bwd_det_parts (64k tokens at L16384, in groups of
// 8) per launch.
template <size_t K, class V>
class RecentAnswers {
 public:
  using Key = std::array<int64_t, K>;
  const V* find(const Key& key) const {
    for (const Entry& e : entries_)
      if (e.used && e.key == key) return &e.value;
    return nullptr;
  }
  // Replaces the oldest answer.
  V remember(const Key& key, V value) {
    entries_[next_] = {key, value, true};
    next_ = (next_ + 1) % entries_.size();
    return value;
  }

 private:
  struct Entry {
    Key key{};
    V value{};
    bool used = false;
  };
  std::array<Entry, 16> entries_{};
  size_t next_ = 0;
};

// The parts a group splits into (powers of two dividing it, at most 8) under a grid time, each
// doubling taken only for a grid kFa3BwdSplitMargin as long; and that time.
template <class StepsFn>
std::pair<int, double> best_split(int64_t group, StepsFn&& steps_of) {
  int parts = 1;
  double best = steps_of(1);
  for (int n = 2; n <= 8 && group % n == 0; n *= 2) {
    const double steps = steps_of(n);
    if (steps < kFa3BwdSplitMargin * best) parts = n, best = steps;
  }
  return {parts, best};
}
}  // namespace

Fa3BwdGrid fa3_bwd_grid(const attention::Problem& p, int sm_count, int keys, int q_rows,
                        int64_t l2_bytes) {
  const attention::Descriptor& d = p.desc;
  const GridShape shape = grid_shape(p, sm_count, keys, q_rows);
  if (shape.blocks == 0) return {};
  const int64_t pairs = shape.pairs, left = shape.left, right = shape.right;
  thread_local RecentAnswers<13, Fa3BwdGrid> memo;
  const int64_t diagonal = static_cast<int64_t>(d.mask.diagonal),
                row_bits = d.head_dim_qk * bits_of(d.dtype);
  const std::array<int64_t, 13> key = {d.batch, d.heads_kv, p.group,  d.len_q,  d.len_k,
                                       left,    right,      diagonal, sm_count, keys,
                                       q_rows,  l2_bytes,   row_bits};
  if (const Fa3BwdGrid* known = memo.find(key)) return *known;
  // Each key block's walk in steps (its query blocks times the group's heads).
  std::vector<double> walk;
  for (const auto& [begin, end] : walk_spans(p, shape, keys, q_rows))
    walk.push_back(static_cast<double>((end - begin) * p.group));
  // The grid's time: its CTAs in launch order (heavy_first: key block major, then part, then
  // (batch, key head); otherwise (batch, key head) major, then key block, then part).
  auto grid_steps = [&](int parts, bool heavy_first) {
    ListSchedule sms(sm_count);
    const double extra = parts > 1 ? kFa3BwdSplitCtaSteps : kFa3BwdCtaSteps;
    auto place = [&](double w) { sms.finish(sms.start() + w / parts + extra); };
    if (heavy_first) {
      for (const double w : walk)
        for (int64_t i = 0; i < pairs * parts; ++i) place(w);
    } else {
      for (int64_t pair = 0; pair < pairs; ++pair)
        for (const double w : walk)
          for (int part = 0; part < parts; ++part) place(w);
    }
    return sms.end();
  };
  Fa3BwdGrid grid;
  const auto [parts, best_steps] = best_split(p.group, [&](int n) { return grid_steps(n, false); });
  grid.parts = parts;
  // Q and dY of every query head (what a wave taken key block first reads from many heads at once)
  // held in L2: heavy first over the split too, for a smaller modelled gain.
  const int64_t q_dy_bytes = 2 * d.batch * d.heads_q * d.len_q * row_bits / 8;
  grid.split = grid.parts;
  grid.split_heavy_first = best_split(p.group, [&](int n) { return grid_steps(n, true); }).first;
  if (best_steps >= kFa3BwdHeavyFirstGain * grid_steps(1, true))
    grid.parts = 1, grid.heavy_first = true;
  else if (q_dy_bytes <= l2_bytes &&
           best_steps >= kFa3BwdResidentHeavyFirstGain * grid_steps(grid.parts, true))
    grid.heavy_first = true;
  return memo.remember(key, grid);
}

int fa3_bwd_det_parts(const attention::Problem& p, int sm_count, int keys, int q_rows, bool rotated,
                      bool rising) {
  const attention::Descriptor& d = p.desc;
  const GridShape shape = grid_shape(p, sm_count, keys, q_rows);
  if (rotated || shape.blocks == 0) return fa3_bwd_grid(p, sm_count, keys, q_rows, 0).split;
  const int64_t pairs = shape.pairs, blocks = shape.blocks;
  thread_local RecentAnswers<11, int> memo;
  const std::array<int64_t, 11> key = {d.batch,       d.heads_kv,
                                       p.group,       d.len_q,
                                       d.len_k,       shape.left,
                                       shape.right,   static_cast<int64_t>(d.mask.diagonal),
                                       sm_count,      int64_t{keys} * 65536 + q_rows,
                                       rising ? 1 : 0};
  if (const int* known = memo.find(key)) return *known;
  const auto spans = walk_spans(p, shape, keys, q_rows);
  const int64_t row_blocks = (d.len_q + q_rows - 1) / q_rows;
  // The grid's time with the ordered adds: CTAs by ticket, each to the SM that frees first, walking
  // its heads' query blocks one step each; a step waits until the chunk's previous adder (an
  // earlier ticket) has counted its add, which it does as it issues its next step. Falling: tickets
  // batch and key head major, key blocks falling, walks head major; rising: key blocks rising and
  // major, walks query block major from the last.
  auto grid_steps = [&](int parts) {
    ListSchedule sms(sm_count);
    std::vector<double> counted(static_cast<size_t>(pairs * p.group * row_blocks), 0.0);
    const double extra = (parts > 1 ? kFa3BwdSplitCtaSteps : kFa3BwdCtaSteps) / 2;
    const int64_t heads = p.group / parts;
    auto run_cta = [&](int64_t pair, int64_t kb, int64_t part) {
      double t = sms.start() + extra;
      double* pending = nullptr;
      auto step = [&](int64_t h, int64_t m) {
        double& chunk = counted[static_cast<size_t>((pair * p.group + h) * row_blocks + m)];
        t = std::max(t, chunk) + 1;
        if (pending) *pending = t;
        pending = &chunk;
      };
      const auto [begin, stop] = spans[static_cast<size_t>(kb)];
      const int64_t h0 = part * heads;
      if (rising) {
        for (int64_t m = stop - 1; m >= begin; --m)
          for (int64_t h = h0; h < h0 + heads; ++h) step(h, m);
      } else {
        for (int64_t h = h0; h < h0 + heads; ++h)
          for (int64_t m = begin; m < stop; ++m) step(h, m);
      }
      if (pending) *pending = t;
      sms.finish(t + extra);
    };
    if (rising) {
      for (int64_t x = 0; x < blocks * parts; ++x)
        for (int64_t pair = 0; pair < pairs; ++pair) run_cta(pair, x / parts, x % parts);
    } else {
      for (int64_t pair = 0; pair < pairs; ++pair)
        for (int64_t x = blocks * parts - 1; x >= 0; --x) run_cta(pair, x / parts, x % parts);
    }
    return sms.end();
  };
  const int parts = best_split(p.group, grid_steps).first;
  return memo.remember(key, parts);
}

std::string_view fa3_ranked_backward_kernel(const attention::Problem& p) {
  return fa3_bwd_widens(p) ? kFa3BwdQ128Kernel : kFa3BwdKernel;
}

Candidate preferred_candidate(const attention::Problem& p, Pass pass, bool fa3_runs,
                              bool cudnn_built) {
  return preferred_candidate(selection_table(), p, pass, fa3_runs, cudnn_built);
}

Candidate candidate_here(const attention::Problem& p, Pass pass, const DeviceCaps& caps) {
  const Candidate c = preferred_candidate(p, pass, true);
  if (c != Candidate::cudnn || cudnn_serves(p, caps)) return c;
  return preferred_candidate(p, pass, true, false);
}

Candidate preferred_candidate(std::span<const TablePoint> table, const attention::Problem& p,
                              Pass pass, bool fa3_runs, bool cudnn_built) {
  const attention::Descriptor& d = p.desc;
  // Problems cuDNN is not given (cudnn_screen: soft-capping, a left bound without a right one,
  // ...) and packed sequences rank the others (varlen: by the point of its longest sequence).
  // Nor a banded backward with a left bound: cuDNN's backward does not skip the key blocks a
  // sliding window excludes (H200, d128 L8192, window (1023, 0): 59 TFLOP/s against fa3's 264 and
  // the bespoke kernel's 179; its forward skipped them, 488 against fa3's 465).
  // (A lambda: the decodes that return before asking skip cudnn_screen's message.)
  // Nor packed sequences: cuDNN's ragged layout reaches them by name or by only(Backend::cudnn).
  // The table's points are padded, and the packed rows (bench_attention attention_varlen, 7
  // sequences of 512-4096 tokens, d128, H200, cuDNN 9.19) had its forward at 0.78-0.80x fa3's
  // varlen forward unmasked and 0.74-0.75x causal, its backward at 0.90-1.00x unmasked and 0.96x
  // causal (ninety-first session; 0.56-0.59x with a bottom-right graph, which runs in the unmasked
  // one's time: cudnn_sdpa.cpp takes the top-left one for packed self-attention).
  auto cudnn_takes = [&] {
    return cudnn_built && !cudnn_screen(p).has_value() &&
           !(pass == Pass::backward && d.mask.left >= 0) && !d.varlen;
  };
  // Short chunks of a GQA group, and the decodes of kFa3PackedDecodeRows' rules: fa3's packed
  // instance fills the 128-row tile with the group's heads and splits the keys (up to 10x the best
  // other candidate: see kFa3PackedChunkRows, kFa3PackedDecodeRows); decodes of 256-wide heads in
  // groups of 1 take its plain instance or cuDNN (wide_head_decode). Measurements, so an empty
  // table (the benches' override: each column its candidate alone) leaves them out like the
  // table's own points.
  if (pass == Pass::forward && fa3_runs && !table.empty()) {
    if (fa3_packs(p)) return Candidate::fa3;
    if (wide_head_decode(p))
      return d.len_q > 1 && cudnn_takes() ? Candidate::cudnn : Candidate::fa3;
  }
  // Other decodes (a few query rows against a long cache) are not what the table measured (Lq =
  // Lk): the family's split-K decode kernel took 57 us where cuDNN took 545 us (Lq 1, Lk 32k, 32
  // heads, GQA 4, d128; 59 vs 385 us at Lq 4 causal; 14 vs 64 us at Lk 4096; H100, 2026-11-23),
  // so the forward of such a problem stays with the family's kernels.
  if (pass == Pass::forward && d.len_q <= kDecodeQueryRows) return Candidate::bespoke;
  const bool cudnn_runs = cudnn_takes();
  // The backward in GQA groups, where the Lq = Lk points (ungrouped) mislead: measured rows
  // (kGroupedBackwardPicks), where their candidate runs; likewise left out under an empty table.
  if (pass == Pass::backward && !table.empty()) {
    const std::optional<Candidate> grouped = grouped_backward_pick(p);
    if (grouped == Candidate::fa3 && fa3_runs) return Candidate::fa3;
    if (grouped == Candidate::cudnn && cudnn_runs) return Candidate::cudnn;
  }
  const bool causal = d.mask.right == 0;
  auto gap = [](int64_t a, int64_t b) {
    return std::abs(std::log2(static_cast<double>(std::max<int64_t>(1, a))) -
                    std::log2(static_cast<double>(std::max<int64_t>(1, b))));
  };
  // Faster by more than kTableLeadMargin to displace cuDNN (then bespoke, then fa3): a tie, or a
  // lead within the runs' spread, keeps the incumbent.
  auto leads = [](double tflops, double incumbent) {
    return tflops > incumbent * (1.0 + kTableLeadMargin);
  };
  auto fastest = [&](const TablePoint& t, bool fa3_ok) {
    Candidate pick = Candidate::cudnn;
    double tf = t.cudnn_tflops;
    if (!cudnn_runs || leads(t.bespoke_tflops, tf))
      pick = Candidate::bespoke, tf = t.bespoke_tflops;
    if (fa3_ok && leads(t.fa3_tflops, tf)) pick = Candidate::fa3;
    return pick;
  };
  // The point of this dtype, pass and causality (chunk points or Lq = Lk ones) of least cost.
  auto nearest = [&](bool chunk_points, auto cost) {
    const TablePoint* best = nullptr;
    double best_cost = 0;
    for (const TablePoint& t : table) {
      if ((t.len_q > 0) != chunk_points || t.dtype != d.dtype || t.pass != pass ||
          t.causal != causal)
        continue;
      const double c = cost(t);
      if (!best || c < best_cost) best = &t, best_cost = c;
    }
    return best;
  };
  // A chunk of a GQA group against a longer cache: the nearest chunk point, where one lies within
  // 2x in head dim and both lengths (the Lq = Lk points below measured neither fa3's nor cuDNN's
  // chunk rate). The chunk points were measured in groups of 4, and the candidates' order depends
  // on the group (bench_attention attention_packed, H200, 2026-11-30, 4096 keys, in groups of 1:
  // the family's kernels 0.81x cuDNN at d64 Lq 32 where the group-4 point has them 1.27x; cuDNN
  // ahead of plain fa3 at d128 Lq 256, 570.8 against 558.9, where the point has fa3 617.0 against
  // 600.6), so ungrouped problems rank by the Lq = Lk points.
  if (pass == Pass::forward && d.len_q < d.len_k && p.group >= 2) {
    const TablePoint* chunk = nearest(true, [&](const TablePoint& t) {
      return gap(t.head_dim, d.head_dim_qk) * 100.0 + gap(t.len, d.len_k) + gap(t.len_q, d.len_q);
    });
    if (chunk && gap(chunk->head_dim, d.head_dim_qk) < 1.0 && gap(chunk->len, d.len_k) <= 1.0 &&
        gap(chunk->len_q, d.len_q) <= 1.0)
      return fastest(*chunk, fa3_runs);
  }
  // Head dim dominates (a different tile shape), then the length band on a log scale.
  const TablePoint* best = nearest(false, [&](const TablePoint& t) {
    return gap(t.head_dim, d.head_dim_qk) * 100.0 + gap(t.len, std::max(d.len_q, d.len_k));
  });
  if (!best) return cudnn_runs ? Candidate::cudnn : Candidate::bespoke;
  Candidate pick = fastest(*best, false);
  const double tf = pick == Candidate::cudnn ? best->cudnn_tflops : best->bespoke_tflops;
  // fa3 was measured with Lq = Lk, and its grid is one 128-row CTA per query block and head: a
  // problem with far fewer queries than the point (decode: Lq = 1 against thousands of keys) is
  // not what that column measured, so fa3 is a candidate with Lq within 2x of the point's L, or
  // as a chunk of queries against a cache of about the point's length (forward), where the
  // chunked-prefill rows measured it (H200, 2026-11-29, 4 x 32 heads against 4096-key caches,
  // d128, bottom-right causal, fa3 by name): from Lq 256 up it kept its Lq = Lk rate (614-635
  // TFLOP/s) and led cuDNN by 1-3%; from Lq 32 up it led the family's kernels 1.2-2.3x (and
  // from Lq 17 in groups of 1: fa3_chunk_rows_over_bespoke); below Lq 256 cuDNN led it by up to
  // 16% (cuDNN's time flat at 58.6-59.9 us for Lq 32-128). (Where the table has chunk points near
  // the problem, they decided above.)
  const bool chunk = pass == Pass::forward && gap(best->len, d.len_k) <= 1.0 &&
                     (d.len_q >= kFa3ChunkRows ||
                      (pick == Candidate::bespoke &&
                       d.len_q >= fa3_chunk_rows_over_bespoke(d.head_dim_qk, d.len_k)));
  const bool fa3_like = gap(best->len, d.len_q) <= 1.0 || chunk;
  if (fa3_runs && fa3_like && leads(best->fa3_tflops, tf)) pick = Candidate::fa3;
  return pick;
}

namespace {
template <class Op>
bool pinned_fits(std::string_view name, const attention::Problem& p, const DeviceCaps& caps) {
  const Kernel<Op>* k = KernelTable<Op>::instance().find(name, p.desc.dtype);
  return k && (!k->fits || k->fits(p, caps));  // none registered: a build without CUDA
}
}  // namespace

bool fa3_fits(const attention::Problem& p, const DeviceCaps& caps, Pass pass) {
  if (pass == Pass::backward) return pinned_fits<attention::BackwardOp>(kFa3BwdKernel, p, caps);
  const std::string_view fwd = p.desc.page_size > 0 ? kFa3PagedKernel
                               : p.desc.seqused_k   ? kFa3CountsKernel
                                                    : kFa3Kernel;
  return pinned_fits<attention::ForwardOp>(fwd, p, caps);
}

template <class Ptr>
Status cudnn_check_layout(std::string_view op, std::string_view arg, const BasicTensor<Ptr>& t,
                          bool is_lse) {
  const int64_t align = is_lse ? 4 : 16;
  const auto addr = reinterpret_cast<uintptr_t>(t.data);
  if (addr % static_cast<uintptr_t>(align) != 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%#" PRIxPTR, addr);
    return Error::misaligned(std::string(op) + ": " + std::string(arg) + ": data=" + buf +
                             " is not " + num(align) + "-byte aligned (cudnn_sdpa needs it)");
  }
  if (is_lse) {
    if (t.rank == 3 && t.shape[2] > 1 && t.stride[2] != 1)
      return Error::unsupported(std::string(op) + ": " + std::string(arg) + ": stride[2]=" +
                                num(t.stride[2]) + ": cudnn_sdpa needs unit-stride LSE rows");
    return {};
  }
  // Every axis but the innermost (unit-stride by the family's rules) steps whole 16-byte vectors;
  // a unit stride elsewhere (an as_strided view whose heads overlap) is no exception: cuDNN's
  // vector loads and stores would fault on it (found by the GPU argument fuzzing).
  const int64_t elem = static_cast<int64_t>(bits_of(t.dtype) / 8);
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;
    int64_t bytes = 0;
    if (!checked_mul(t.stride[i], elem, &bytes) || bytes % 16 != 0)
      return Error::misaligned(std::string(op) + ": " + std::string(arg) + ": stride[" + num(i) +
                               "]=" + num(t.stride[i]) + " elements is not a multiple of 16 " +
                               "bytes (cudnn_sdpa reads 16-byte vectors)");
  }
  return {};
}
template Status cudnn_check_layout(std::string_view, std::string_view, const Tensor&, bool);
template Status cudnn_check_layout(std::string_view, std::string_view, const ConstTensor&, bool);

}  // namespace baracuda::attention_hopper

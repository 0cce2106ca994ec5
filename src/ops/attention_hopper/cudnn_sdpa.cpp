// cuDNN backend of attention::ForwardOp / attention::BackwardOp through the cuDNN frontend's SDPA
// graphs (bf16 and f16; no mask, causal top-left / bottom-right, windows with a right bound, GQA;
// packed sequences (varlen) forward and backward in cuDNN's ragged layout under its padding mask,
// with the passes of cudnn_varlen.hpp around the graph).
//
// Life cycle: the kernels' `fits` hook runs in Plan::select. It builds the cuDNN graph for the
// problem in the canonical [B, H, L, D] layout, caches it keyed by problem and strides, and answers
// false when cuDNN refuses it (so the bespoke kernel is picked instead); `workspace` returns that
// graph's exact workspace size. `launch` looks up the graph for the
// run's actual strides (building one on first use of an unusual layout, host work only) and
// executes it on the caller's stream with the caller's workspace.
//
// cuDNN graphs carry their strides, so a layout seen for the first time in run() costs a graph
// build there (host only; no device allocation, no synchronization).
// Problems cudnn_tunes() accepts are tuned once, in select(): every configuration cuDNN offers for
// the canonical graph is timed on scratch tensors and the fastest runs (tune_locked); other
// layouts' graphs are built on that configuration.
// The frontend's JSON serialization is unused here and costs compile time.
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "baracuda/ops/attention.hpp"
#include "baracuda/ops/attention_hopper.hpp"
#include "core/cuda/check.hpp"
#include "ops/attention_hopper/cudnn_varlen.hpp"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
#include <cudnn_frontend.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace baracuda::attention_hopper {
namespace {

namespace fe = cudnn_frontend;
using attention::BackwardArguments;
using attention::ForwardArguments;
using attention::Problem;

enum class Kind : uint8_t { forward, backward, backward_deterministic };

// Tensor uids of the variant pack; from kSeqQ on, varlen's lengths and ragged offsets.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kLse,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqQ,
  kSeqKV,
  kOffQ,
  kOffK,
  kOffV,
  kOffO,
  kOffStats,
  kOffDO,
  kOffDQ,
  kOffDK,
  kOffDV
};
// The ragged offsets of each pass, in the order of its Layout's tensors (the statistics' fifth in
// both, where the forward's row pass finds them).
constexpr int64_t kForwardOffsets[] = {kOffQ, kOffK, kOffV, kOffO, kOffStats};
constexpr int64_t kBackwardOffsets[] = {kOffQ,  kOffK,  kOffV,  kOffO, kOffStats,
                                        kOffDO, kOffDQ, kOffDK, kOffDV};
constexpr int kStatsOffset = 4;
static_assert(kForwardOffsets[kStatsOffset] == kOffStats &&
              kBackwardOffsets[kStatsOffset] == kOffStats);
static_assert(std::size(kBackwardOffsets) <= kMaxRagged);
std::span<const int64_t> ragged_uids(Kind kind) {
  if (kind == Kind::forward) return kForwardOffsets;
  return kBackwardOffsets;
}

// Strides of every tensor of one run as cuDNN sees them: [B, H, L, D] order, D unit-stride.
struct Layout {
  std::vector<std::array<int64_t, 4>> strides;  // per tensor, in Uid order of the pass
  bool operator<(const Layout& o) const { return strides < o.strides; }
};

struct Key {
  Kind kind;
  int device;
  DType dtype;
  int64_t b, hq, hk, lq, lk, dk, dv, left, right;
  bool bottom_right;
  bool varlen;
  int64_t total_q, total_k;  // varlen: rows of the packed tensors (0 otherwise)
  uint64_t scale_bits;
  Layout layout;
  auto tie() const {
    return std::tie(kind, device, dtype, b, hq, hk, lq, lk, dk, dv, left, right, bottom_right,
                    varlen, total_q, total_k, scale_bits, layout);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN refused the problem
  int64_t workspace = 0;
  std::string why;  // cuDNN's message when refused
  // Tuning (cudnn_tunes): configurations timed (0: the heuristics' first choice), and the
  // configuration that runs, by name and as engine + knobs (what another layout's graph replays).
  int timed = 0;
  int64_t index = -1;  // the tuned configuration's index in the graph (-1: the graph's candidate)
  std::string plan;
  int64_t engine = -1;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
};

// One handle per device, shared by every plan; `mu` serializes setStream + execute on it (both are
// host-side enqueue calls, so the lock is held for microseconds).
struct State {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;
  std::map<Key, std::shared_ptr<Entry>> graphs;
};
State& state() {
  static State* s = new State;  // never destroyed: handles outlive static destruction order
  return *s;
}

// Sets the current device for a scope (cuDNN handles and builds bind to it).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&old_) != cudaSuccess) old_ = -1;
    if (old_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (old_ >= 0) cudaSetDevice(old_);
  }

 private:
  int old_ = -1;
};

// Caller holds state().mu.
cudnnHandle_t handle_locked(int device, std::string* why) {
  auto& hs = state().handles;
  if (auto it = hs.find(device); it != hs.end()) return it->second;
  DeviceGuard guard(device);
  cudnnHandle_t h = nullptr;
  if (const cudnnStatus_t s = cudnnCreate(&h); s != CUDNN_STATUS_SUCCESS) {
    *why = std::string("cudnnCreate: ") + cudnnGetErrorString(s);
    return nullptr;
  }
  hs.emplace(device, h);
  return h;
}

fe::DataType_t fe_type(DType t) {
  return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

std::array<int64_t, 4> strides4(const int64_t* st) {
  return {st[0], st[1], st[2], st[3]};
}

// Canonical strides of a [B, H, L, D] tensor stored as [B, H, L, D] or as [B, L, H, D].
std::array<int64_t, 4> canonical(int64_t h, int64_t l, int64_t d, bool bhld) {
  return bhld ? std::array<int64_t, 4>{h * l * d, l * d, d, 1}
              : std::array<int64_t, 4>{l * h * d, d, h * d, 1};
}

// A packed [T, H, D] tensor as cuDNN's ragged [B, H, L, D] sees it (token stride `row`, head
// stride `head`; the batch stride is unused where ragged offsets place each sequence).
std::array<int64_t, 4> ragged(int64_t l, int64_t row, int64_t head) {
  return {l * row, head, row, 1};
}

Layout canonical_layout(const Problem& p, Kind kind, bool bhld) {
  const auto& d = p.desc;
  if (d.varlen) {  // the statistics in the workspace as [Tq, Hq]
    const int64_t hq = d.heads_q, hk = d.heads_kv;
    const auto q = ragged(d.len_q, hq * d.head_dim_qk, d.head_dim_qk),
               k = ragged(d.len_k, hk * d.head_dim_qk, d.head_dim_qk),
               v = ragged(d.len_k, hk * d.head_dim_v, d.head_dim_v),
               o = ragged(d.len_q, hq * d.head_dim_v, d.head_dim_v), stats = ragged(d.len_q, hq, 1);
    if (kind == Kind::forward) return {{q, k, v, o, stats}};
    return {{q, k, v, o, stats, o, q, k, v}};
  }
  const auto q = canonical(d.heads_q, d.len_q, d.head_dim_qk, bhld);
  const auto k = canonical(d.heads_kv, d.len_k, d.head_dim_qk, bhld);
  const auto v = canonical(d.heads_kv, d.len_k, d.head_dim_v, bhld);
  const auto o = canonical(d.heads_q, d.len_q, d.head_dim_v, bhld);
  const std::array<int64_t, 4> lse{d.heads_q * d.len_q, d.len_q, 1, 1};
  if (kind == Kind::forward) return {{q, k, v, o, lse}};
  return {{q, k, v, o, lse, o, q, k, v}};  // q k v o lse dO dQ dK dV
}

Key key_of(const Problem& p, Kind kind, int device, Layout layout) {
  const auto& d = p.desc;
  uint64_t bits = 0;
  const double scale = p.scale;
  std::memcpy(&bits, &scale, sizeof bits);
  return {kind,
          device,
          d.dtype,
          d.batch,
          d.heads_q,
          d.heads_kv,
          d.len_q,
          d.len_k,
          d.head_dim_qk,
          d.head_dim_v,
          d.mask.left,
          d.mask.right,
          d.mask.diagonal == attention::Diagonal::bottom_right,
          d.varlen,
          d.varlen ? d.total_q : 0,
          d.varlen ? d.total_k : 0,
          bits,
          std::move(layout)};
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& g, const char* name,
                                                     int64_t uid, std::array<int64_t, 4> dims,
                                                     const std::array<int64_t, 4>& st) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({dims[0], dims[1], dims[2], dims[3]})
                      .set_stride({st[0], st[1], st[2], st[3]}));
}

template <class Attrs>
void set_mask(Attrs& a, const attention::Mask& m) {
  if (m.right < 0) return;  // no band (a left bound alone is screened out before)
  a.set_diagonal_alignment(m.diagonal == attention::Diagonal::bottom_right
                               ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                               : fe::DiagonalAlignment_t::TOP_LEFT);
  a.set_diagonal_band_right_bound(static_cast<int>(m.right));
  // cuDNN keeps key j when j + W > d(i), i.e. j >= d(i) - (W - 1): W = left + 1.
  if (m.left >= 0) a.set_diagonal_band_left_bound(static_cast<int>(m.left + 1));
}

// ---- Tuning (cudnn_tunes) ----------------------------------------------------------------------

// Device scratch for the timed runs (freed with the vector), filled with random values in
// [-1, 1) where `random`: the timings of constant or zero data are not those of real data. One
// host block of values is copied over and over. Null when an allocation or copy failed.
void* scratch(std::vector<Buffer>& owned, int device, size_t bytes, DType t, bool random,
              uint64_t seed) {
  auto b = Buffer::allocate(std::max<size_t>(bytes, 256), Location::cuda(device));
  if (!b.ok()) return nullptr;
  const size_t esize = static_cast<size_t>(bits_of(t) / 8);
  if (random && bytes >= esize) {
    const size_t block = std::min<size_t>(bytes / esize, size_t{1} << 20);
    std::vector<uint8_t> host(block * esize);
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (size_t i = 0; i < block; ++i)
      store_from_double(host.data(), t, static_cast<int64_t>(i), u(g));
    for (size_t off = 0; off < bytes; off += host.size())
      if (!copy_bytes(static_cast<char*>(b->data()) + off, b->where(), host.data(),
                      Location::host(), std::min(host.size(), bytes - off))
               .ok())
        return nullptr;
  }
  owned.push_back(std::move(b).value());
  return owned.back().data();
}

// Mean time of `reps` back-to-back runs of configuration `i` (ms; < 0 on an error).
float time_plan(fe::graph::Graph& g, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack,
                void* work, int64_t i, int reps, cudaEvent_t start, cudaEvent_t stop) {
  if (cudaEventRecord(start, nullptr) != cudaSuccess) return -1;
  for (int r = 0; r < reps; ++r)
    if (g.execute_plan_at_index(h, pack, work, i).is_bad()) return -1;
  float ms = 0;
  if (cudaEventRecord(stop, nullptr) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
    return -1;
  return ms / static_cast<float>(reps);
}

struct Tuned {
  int timed = 0;       // configurations timed
  int64_t index = -1;  // the fastest (-1: none timed)
};

// Times every configuration `g` built on scratch tensors in the canonical layout: each one
// warmed up, then the best of three means of back-to-back runs (~1 ms each; a single synchronized
// run, as the frontend's autotune times, measured launch gaps and moved between calls). Tuned{}
// leaves the heuristics' first choice (scratch over budget, allocation failed, one configuration).
// Caller holds state().mu and the device guard.
Tuned tune_locked(fe::graph::Graph& g, const Problem& p, Kind kind, int device, cudnnHandle_t h) {
  const int64_t count = g.get_execution_plan_count();
  if (count < 2) return {};
  const auto& d = p.desc;
  const int64_t nq = d.batch * d.heads_q * d.len_q * d.head_dim_qk,
                nk = d.batch * d.heads_kv * d.len_k * d.head_dim_qk,
                nv = d.batch * d.heads_kv * d.len_k * d.head_dim_v,
                no = d.batch * d.heads_q * d.len_q * d.head_dim_v,
                nl = d.batch * d.heads_q * d.len_q;
  const int64_t ws = g.get_autotune_workspace_size();
  const bool fwd = kind == Kind::forward;
  const int64_t bytes = 2 * (nq + nk + nv + no) * (fwd ? 1 : 2) + 4 * nl + ws;
  if (ws < 0 || bytes > kCudnnTuneScratchBytes) return {};
  std::vector<Buffer> owned;
  std::unordered_map<int64_t, void*> pack;
  uint64_t seed = 20261126;
  auto input = [&](int64_t uid, int64_t n) {
    return (pack[uid] = scratch(owned, device, static_cast<size_t>(n) * 2, d.dtype, true,
                                seed++)) != nullptr;
  };
  auto output = [&](int64_t uid, size_t n_bytes) {
    return (pack[uid] = scratch(owned, device, n_bytes, d.dtype, false, 0)) != nullptr;
  };
  bool ok = input(kQ, nq) && input(kK, nk) && input(kV, nv);
  if (fwd) {
    ok = ok && output(kO, static_cast<size_t>(no) * 2) && output(kLse, static_cast<size_t>(nl) * 4);
  } else {
    ok = ok && input(kO, no) && input(kDO, no) && output(kLse, static_cast<size_t>(nl) * 4) &&
         output(kDQ, static_cast<size_t>(nq) * 2) && output(kDK, static_cast<size_t>(nk) * 2) &&
         output(kDV, static_cast<size_t>(nv) * 2);
    // The backward reads LSE: that of scores near 0 over Lk keys, so probabilities stay finite.
    if (ok) {
      const std::vector<float> lse(static_cast<size_t>(nl), std::log(static_cast<float>(d.len_k)));
      ok = copy_bytes(pack[kLse], Location::cuda(device), lse.data(), Location::host(),
                      lse.size() * 4)
               .ok();
    }
  }
  void* work = ok ? scratch(owned, device, static_cast<size_t>(ws), d.dtype, false, 0) : nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!ok || !work || cudnnSetStream(h, nullptr) != CUDNN_STATUS_SUCCESS ||
      cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start) cudaEventDestroy(start);
    (void)cudaGetLastError();
    return {};
  }
  Tuned t;
  float best = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float once = time_plan(g, h, pack, work, i, 1, start, stop);  // warm-up
    if (once < 0) continue;
    const int reps = static_cast<int>(std::clamp(1.0f / std::max(once, 1e-3f), 2.0f, 50.0f));
    float ms = std::numeric_limits<float>::max();
    for (int r = 0; r < 3 && ms >= 0; ++r) {
      const float m = time_plan(g, h, pack, work, i, reps, start, stop);
      ms = m < 0 ? -1 : std::min(ms, m);
    }
    if (ms < 0) continue;
    ++t.timed;
    if (t.index < 0 || ms < best) t.index = i, best = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  (void)cudaDeviceSynchronize();
  (void)cudaGetLastError();
  return t;
}

// Builds (or finds) the graph for `key`. Caller holds state().mu. `replay`: another layout of a
// tuned problem may take the canonical graph's tuned configuration (false after cuDNN refused it).
std::shared_ptr<Entry> graph_locked(const Problem& p, const Key& key, bool replay = true) {
  auto& graphs = state().graphs;
  if (auto it = graphs.find(key); it != graphs.end()) return it->second;
  auto e = std::make_shared<Entry>();
  graphs.emplace(key, e);
  cudnnHandle_t h = handle_locked(key.device, &e->why);
  if (!h) return e;
  DeviceGuard guard(key.device);
  const auto& d = p.desc;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(d.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto& st = key.layout.strides;
  const std::array<int64_t, 4> qd{d.batch, d.heads_q, d.len_q, d.head_dim_qk},
      kd{d.batch, d.heads_kv, d.len_k, d.head_dim_qk},
      vd{d.batch, d.heads_kv, d.len_k, d.head_dim_v}, od{d.batch, d.heads_q, d.len_q, d.head_dim_v},
      ld{d.batch, d.heads_q, d.len_q, 1};
  auto q = tensor(*g, "Q", kQ, qd, st[0]);
  auto k = tensor(*g, "K", kK, kd, st[1]);
  auto v = tensor(*g, "V", kV, vd, st[2]);
  // Varlen: int32 [B, 1, 1, 1] lengths and [B + 1, 1, 1, 1] element offsets (cudnn_varlen.hpp).
  auto index = [&](const char* name, int64_t uid, int64_t n) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({n, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  if (key.varlen) {
    q->set_ragged_offset(index("off_q", kOffQ, d.batch + 1));
    k->set_ragged_offset(index("off_k", kOffK, d.batch + 1));
    v->set_ragged_offset(index("off_v", kOffV, d.batch + 1));
  }
  const float scale = static_cast<float>(p.scale);
  auto out = [](const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid,
                std::array<int64_t, 4> dims, const std::array<int64_t, 4>& s) {
    t->set_output(true)
        .set_uid(uid)
        .set_dim({dims[0], dims[1], dims[2], dims[3]})
        .set_stride({s[0], s[1], s[2], s[3]});
  };
  if (key.kind == Kind::forward) {
    fe::graph::SDPA_attributes a;
    a.set_name("sdpa_forward").set_generate_stats(true).set_attn_scale(scale);
    set_mask(a, d.mask);
    if (key.varlen)  // each sequence's own lengths; its bottom-right diagonal at its own end
      a.set_padding_mask(true)
          .set_seq_len_q(index("seq_len_q", kSeqQ, d.batch))
          .set_seq_len_kv(index("seq_len_kv", kSeqKV, d.batch))
          .set_max_total_seq_len_q(key.total_q)
          .set_max_total_seq_len_kv(key.total_k);
    auto [o, stats] = g->sdpa(q, k, v, a);
    out(o, kO, od, st[3]);
    out(stats, kLse, ld, st[4]);
    stats->set_data_type(fe::DataType_t::FLOAT);
    if (key.varlen) {
      o->set_ragged_offset(index("off_o", kOffO, d.batch + 1));
      stats->set_ragged_offset(index("off_stats", kOffStats, d.batch + 1));
    }
  } else {
    auto o = tensor(*g, "O", kO, od, st[3]);
    auto stats = tensor(*g, "Stats", kLse, ld, st[4]);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto dout = tensor(*g, "dO", kDO, od, st[5]);
    fe::graph::SDPA_backward_attributes a;
    a.set_name("sdpa_backward")
        .set_attn_scale(scale)
        .set_deterministic_algorithm(key.kind == Kind::backward_deterministic);
    set_mask(a, d.mask);
    if (key.varlen) {
      o->set_ragged_offset(index("off_o", kOffO, d.batch + 1));
      stats->set_ragged_offset(index("off_stats", kOffStats, d.batch + 1));
      dout->set_ragged_offset(index("off_do", kOffDO, d.batch + 1));
      // The max totals size cuDNN's f32 dQ / dK / dV accumulators by the packed rows instead of
      // B x the longest sequence.
      a.set_padding_mask(true)
          .set_seq_len_q(index("seq_len_q", kSeqQ, d.batch))
          .set_seq_len_kv(index("seq_len_kv", kSeqKV, d.batch))
          .set_max_total_seq_len_q(key.total_q)
          .set_max_total_seq_len_kv(key.total_k);
    }
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, a);
    out(dq, kDQ, qd, st[6]);
    out(dk, kDK, kd, st[7]);
    out(dv, kDV, vd, st[8]);
    if (key.varlen) {
      dq->set_ragged_offset(index("off_dq", kOffDQ, d.batch + 1));
      dk->set_ragged_offset(index("off_dk", kOffDK, d.batch + 1));
      dv->set_ragged_offset(index("off_dv", kOffDV, d.batch + 1));
    }
  }
  auto step = [&](fe::error_t s, const char* what) {
    if (s.is_good()) return true;
    e->why = std::string(what) + ": " + s.get_message();
    return false;
  };
  if (!step(g->validate(), "validate") ||
      !step(g->build_operation_graph(h), "build_operation_graph"))
    return e;
  const Key canon = key_of(p, key.kind, key.device, canonical_layout(p, key.kind, true));
  const bool is_canonical = !(key < canon) && !(canon < key);
  const bool tune = cudnn_tunes(p);
  bool built = false;
  if (tune && !is_canonical && replay) {
    // Another layout of a tuned problem: the configuration tuned on the canonical graph, if cuDNN
    // takes it for this one.
    if (auto it = graphs.find(canon); it != graphs.end() && it->second->engine >= 0) {
      built = g->create_execution_plan(it->second->engine, it->second->knobs).is_good() &&
              g->check_support(h).is_good() && g->build_plans().is_good();
      if (!built) {  // start over from the heuristics on a fresh graph
        graphs.erase(key);
        return graph_locked(p, key, /*replay=*/false);
      }
    }
  }
  if (!built) {
    // Tuning also times the fallback list: configurations the ranked list (mode A) leaves out
    // for this graph (engines another frontend version's graph of the same problem got).
    const std::vector<fe::HeurMode_t> modes =
        tune && is_canonical
            ? std::vector<fe::HeurMode_t>{fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}
            : std::vector<fe::HeurMode_t>{fe::HeurMode_t::A};
    if (!step(g->create_execution_plans(modes), "create_execution_plans") ||
        !step(g->check_support(h), "check_support") ||
        !step(g->build_plans(tune && is_canonical ? fe::BuildPlanPolicy_t::ALL
                                                  : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
              "build_plans"))
      return e;
    if (tune && is_canonical) {
      const Tuned t = tune_locked(*g, p, key.kind, key.device, h);
      e->timed = t.timed;
      e->index = t.index;
    }
  }
  int64_t ws = 0;
  if (e->index >= 0) {
    if (!step(g->get_workspace_size_plan_at_index(e->index, ws), "get_workspace_size")) return e;
    (void)g->get_plan_name_at_index(e->index, e->plan);
    (void)g->get_engine_and_knobs_at_index(e->index, e->engine, e->knobs);
  } else {
    if (!step(g->get_workspace_size(ws), "get_workspace_size")) return e;
    (void)g->get_plan_name(e->plan);
  }
  e->workspace = ws;
  e->graph = std::move(g);
  return e;
}

// f(the cached entry of the problem's canonical layout for `kind` on `device`, or null where none
// was asked for), under the state's lock; builds nothing.
template <class F>
auto with_cached_entry(const Problem& p, Kind kind, int device, F&& f) {
  std::lock_guard lock(state().mu);
  const auto& graphs = state().graphs;
  const auto it = graphs.find(key_of(p, kind, device, canonical_layout(p, kind, true)));
  return f(it == graphs.end() ? nullptr : it->second.get());
}

// Packed sequences, backward, at head dims over 128: measured (H200, cuDNN 9.19, ninety-first
// session) with dense tensors, both algorithms left dK / dV rows unwritten and the atomic one
// dQ wrong or unwritten, at every case tried (with and without masks); at 64 and 128 they matched.
std::optional<std::string> varlen_backward_refusal(const Problem& p) {
  const auto& d = p.desc;
  if (!d.varlen || (d.head_dim_qk <= 128 && d.head_dim_v <= 128)) return std::nullopt;
  return "varlen backward with head_dim_qk=" + std::to_string(d.head_dim_qk) +
         ", head_dim_v=" + std::to_string(d.head_dim_v) +
         ": cuDNN's ragged backward over 128 was measured leaving gradient rows unwritten";
}

// The graph of the canonical [B, H, L, D] layout decides whether the kernel fits and sets the
// plan's workspace (cuDNN's SDPA workspace follows the shapes, not the strides; a layout whose
// graph needs more is refused in launch with workspace_too_small). Other layouts build on first
// use.
bool fits_kind(const Problem& p, const DeviceCaps& caps, Kind kind) {
  if (!cudnn_serves(p, caps)) return false;
  if (kind != Kind::forward && varlen_backward_refusal(p)) return false;
  std::lock_guard lock(state().mu);
  return graph_locked(p, key_of(p, kind, caps.device, canonical_layout(p, kind, true)))->graph !=
         nullptr;
}

// cuDNN (before 9.26) reads the backward's LSE only as a packed [B, H, L] tensor, so the backward
// keeps a packed copy in the tail of its workspace when the caller's LSE is strided.
size_t round_up(size_t v) {
  return (v + 255) / 256 * 256;
}
size_t lse_pack_bytes(const Problem& p) {
  const auto& d = p.desc;
  return static_cast<size_t>(d.batch * d.heads_q * d.len_q) * sizeof(float);
}
bool lse_packed(const Problem& p, const ConstTensor& lse) {
  const auto& d = p.desc;
  return (d.len_q == 1 || lse.stride[2] == 1) && (d.heads_q == 1 || lse.stride[1] == d.len_q) &&
         (d.batch == 1 || lse.stride[0] == d.heads_q * d.len_q);
}

// A varlen pass's workspace tail after cuDNN's region: the statistics [Tq, Hq] f32 at its start
// (the forward's out of cuDNN, the backward's into it), then the two length vectors [B] and one
// offset vector [B + 1] (int32) per ragged tensor of the pass, each 256-byte aligned.
struct VarlenTail {
  size_t seq_q = 0, seq_kv = 0, off = 0, bytes = 0;  // offsets into the tail
  size_t off_bytes = 0;                              // one offset vector, rounded
};
VarlenTail varlen_tail(const Problem& p, Kind kind) {
  const auto& d = p.desc;
  VarlenTail t;
  const size_t lengths = round_up(static_cast<size_t>(d.batch) * sizeof(int32_t));
  t.off_bytes = round_up(static_cast<size_t>(d.batch + 1) * sizeof(int32_t));
  t.seq_q = round_up(static_cast<size_t>(d.total_q * d.heads_q) * sizeof(float));
  t.seq_kv = t.seq_q + lengths;
  t.off = t.seq_kv + lengths;
  t.bytes = t.off + ragged_uids(kind).size() * t.off_bytes;
  return t;
}

size_t workspace_kind(const Problem& p, const DeviceCaps& caps, Kind kind) {
  std::lock_guard lock(state().mu);
  auto e = graph_locked(p, key_of(p, kind, caps.device, canonical_layout(p, kind, true)));
  if (!e->graph) return 0;
  const size_t ws = static_cast<size_t>(e->workspace);
  if (p.desc.varlen) return round_up(ws) + varlen_tail(p, kind).bytes;
  if (kind == Kind::forward) return ws;
  return round_up(ws) + lse_pack_bytes(p);
}

// Copies a strided LSE (unit-stride rows, checked before) into the packed buffer `dst`.
Status pack_lse(const LaunchContext& ctx, std::string_view op, const Problem& p,
                const ConstTensor& lse, void* dst) {
  const auto& d = p.desc;
  const cudaStream_t s = static_cast<cudaStream_t>(ctx.stream.cuda_handle());
  const size_t row = static_cast<size_t>(d.len_q) * sizeof(float);
  const auto* src = static_cast<const char*>(lse.data);
  auto* out = static_cast<char*>(dst);
  cudaError_t err = cudaSuccess;
  for (int64_t b = 0; b < d.batch && err == cudaSuccess; ++b) {
    const char* sb = src + b * lse.stride[0] * 4;
    char* ob = out + static_cast<size_t>(b * d.heads_q) * row;
    if (lse.stride[1] >= d.len_q) {  // rows do not overlap: one pitched copy per sequence
      err = cudaMemcpy2DAsync(ob, row, sb, static_cast<size_t>(lse.stride[1]) * 4, row,
                              static_cast<size_t>(d.heads_q), cudaMemcpyDeviceToDevice, s);
    } else {  // overlapping or broadcast rows: one copy per row
      for (int64_t h = 0; h < d.heads_q && err == cudaSuccess; ++h)
        err = cudaMemcpyAsync(ob + h * row, sb + h * lse.stride[1] * 4, row,
                              cudaMemcpyDeviceToDevice, s);
    }
  }
  if (err != cudaSuccess)
    return Error::cuda(std::string(op) + ": cudnn_sdpa: packing lse: " + cudaGetErrorName(err),
                       static_cast<int>(err));
  return {};
}

template <class Ptr>
std::array<int64_t, 4> bhld_strides(const BasicTensor<Ptr>& t) {
  return strides4(t.stride.data());
}
std::array<int64_t, 4> lse_strides(const ConstTensor& t) {
  return {t.stride[0], t.stride[1], t.stride[2], 1};
}

// Executes the graph for the run's layout. Inputs are const in our API; cuDNN's variant pack
// takes void* for every tensor and only reads the inputs.
// `graph_ws` bytes at the head of the caller's workspace belong to cuDNN; `before` runs on the
// stream right before the graph (after every check, so a refused run writes nothing).
Status execute(const LaunchContext& ctx, std::string_view op, const Problem& p, Kind kind,
               Layout layout, std::unordered_map<int64_t, void*> pack, size_t graph_ws,
               const std::function<Status()>& before = nullptr) {
  const int device = ctx.stream.device();
  std::lock_guard lock(state().mu);
  auto e = graph_locked(p, key_of(p, kind, device, std::move(layout)));
  if (!e->graph)
    return Error::unsupported(std::string(op) +
                              ": cudnn_sdpa: cuDNN refuses this tensor layout "
                              "(strides), which select() could not foresee: " +
                              e->why);
  if (static_cast<uint64_t>(e->workspace) > graph_ws)
    return Error::workspace_too_small(
        std::string(op) + ": cudnn_sdpa: this layout's cuDNN graph needs more workspace than " +
            "the plan's canonical layout",
        static_cast<uint64_t>(e->workspace), graph_ws);
  std::string why;
  cudnnHandle_t h = handle_locked(device, &why);
  if (!h) return Error::library(std::string(op) + ": cudnn_sdpa: " + why, "cudnn", 0);
  if (const cudnnStatus_t s =
          cudnnSetStream(h, static_cast<cudaStream_t>(ctx.stream.cuda_handle()));
      s != CUDNN_STATUS_SUCCESS)
    return Error::library(
        std::string(op) + ": cudnn_sdpa: cudnnSetStream: " + cudnnGetErrorString(s), "cudnn",
        static_cast<int64_t>(s));
  DeviceGuard guard(device);
  if (before) BARACUDA_TRY(before());
  auto st = e->index >= 0 ? e->graph->execute_plan_at_index(h, pack, ctx.workspace.data, e->index)
                          : e->graph->execute(h, pack, ctx.workspace.data);
  if (st.is_bad())
    return Error::library(std::string(op) + ": cudnn_sdpa: execute: " + st.get_message(), "cudnn",
                          static_cast<int64_t>(st.get_code()));
  return {};
}

void* w(const void* p) {
  return const_cast<void*>(p);
}

// Packed sequences: cuDNN reads the ragged offsets as int32 elements, and the last (B's) is the
// packed rows times the token stride.
struct RaggedArg {
  const char* name;
  ConstTensor t;
  bool keys;  // total_k rows (K's side) or total_q
};
Status check_ragged_offsets(std::string_view op, const Problem& p,
                            std::initializer_list<RaggedArg> args) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  for (const RaggedArg& a : args) {
    const int64_t rows = a.keys ? p.desc.total_k : p.desc.total_q;
    if (rows > 0 && a.t.stride[0] > kInt32Max / rows)
      return Error::unsupported(std::string(op) + ": cudnn_sdpa: " + a.name +
                                ": varlen: " + std::to_string(rows) +
                                " rows at stride[0]=" + std::to_string(a.t.stride[0]) +
                                " exceed cuDNN's int32 ragged offsets");
  }
  return {};
}

// Packed sequences, backward: every tensor dense [T, H, D]. Measured (H200, cuDNN 9.19,
// ninety-first session): with the inputs' rows padded by 8 elements and dense gradients, both of
// cuDNN's algorithms wrote dK / dV rows in the wrong places and the atomic one a wrong dQ, once an
// illegal instruction; with every tensor dense they matched the float64 reference at every case.
// And cuDNN lays its f32 accumulators out by the gradients' own strides over the packed rows (its
// GQA ones by the token stride times the group, right only token-major), so a padded gradient
// would outgrow the workspace the plan sized from the descriptor.
Status check_dense_ragged_backward(std::string_view op, const Problem& p,
                                   const BackwardArguments& a) {
  const auto& d = p.desc;
  const int64_t dk = d.head_dim_qk, dv = d.head_dim_v, hq = d.heads_q, hk = d.heads_kv;
  const std::tuple<const char*, ConstTensor, int64_t, int64_t, int64_t> all[] = {
      {"q", a.q, d.total_q, hq, dk},
      {"k", a.k, d.total_k, hk, dk},
      {"v", a.v, d.total_k, hk, dv},
      {"y", a.y, d.total_q, hq, dv},
      {"dy", a.dy, d.total_q, hq, dv},
      {"dq", as_const(a.dq), d.total_q, hq, dk},
      {"dk", as_const(a.dk), d.total_k, hk, dk},
      {"dv", as_const(a.dv), d.total_k, hk, dv}};
  for (const auto& [name, t, rows, heads, dim] : all)
    if ((rows > 1 && t.stride[0] != heads * dim) || (heads > 1 && t.stride[1] != dim))
      return Error::unsupported(std::string(op) + ": cudnn_sdpa: " + name + ": varlen: strides (" +
                                std::to_string(t.stride[0]) + ", " + std::to_string(t.stride[1]) +
                                ", 1) are not dense [T, H, D] (" + std::to_string(heads * dim) +
                                ", " + std::to_string(dim) +
                                ", 1): cuDNN's ragged backward takes dense tensors only");
  return {};
}

// cuDNN's alignment and stride rules (cudnn_check_layout) on the run's tensors: the registry's
// check, so that can_implement refuses what launch would. (Whether cuDNN builds a graph for an
// accepted layout is only known when it tries: execute's own error says so.)
Status check_forward(const Problem& p, const ForwardArguments& a) {
  const std::string_view op = attention::ForwardOp::name;
  BARACUDA_TRY(cudnn_check_layout(op, "q", a.q, false));
  BARACUDA_TRY(cudnn_check_layout(op, "k", a.k, false));
  BARACUDA_TRY(cudnn_check_layout(op, "v", a.v, false));
  BARACUDA_TRY(cudnn_check_layout(op, "y", a.y, false));
  BARACUDA_TRY(cudnn_check_layout(op, "lse", a.lse, true));
  if (!p.desc.varlen) return {};
  return check_ragged_offsets(
      op, p, {{"q", a.q, false}, {"k", a.k, true}, {"v", a.v, true}, {"y", as_const(a.y), false}});
}
Status check_backward(const Problem& p, const BackwardArguments& a) {
  const std::string_view op = attention::BackwardOp::name;
  const std::pair<const char*, ConstTensor> ins[] = {
      {"q", a.q}, {"k", a.k}, {"v", a.v}, {"y", a.y}, {"dy", a.dy}};
  for (const auto& [n, t] : ins) BARACUDA_TRY(cudnn_check_layout(op, n, t, false));
  BARACUDA_TRY(cudnn_check_layout(op, "lse", a.lse, true));
  for (const auto& [n, t] : {std::pair{"dq", a.dq}, {"dk", a.dk}, {"dv", a.dv}})
    BARACUDA_TRY(cudnn_check_layout(op, n, t, false));
  if (!p.desc.varlen) return {};
  BARACUDA_TRY(check_dense_ragged_backward(op, p, a));
  return check_ragged_offsets(op, p,
                              {{"q", a.q, false},
                               {"k", a.k, true},
                               {"v", a.v, true},
                               {"y", a.y, false},
                               {"dy", a.dy, false},
                               {"dq", as_const(a.dq), false},
                               {"dk", as_const(a.dk), true},
                               {"dv", as_const(a.dv), true}});
}

// A varlen pass's workspace split (cuDNN's region, then the tail) and the prep that fills the
// tail: lengths, one offset vector per ragged tensor (`rows`: each tensor's token stride and side,
// in the order of the pass's offsets), the statistics at the tail's start.
struct VarlenRun {
  size_t graph_ws = 0;
  float* stats = nullptr;
  RaggedPrep prep;
};
Result<VarlenRun> varlen_run(const LaunchContext& ctx, std::string_view op, const Problem& p,
                             Kind kind, const ConstTensor& cu_q, const ConstTensor& cu_k,
                             std::initializer_list<std::pair<int64_t, bool>> rows) {
  const auto& d = p.desc;
  const VarlenTail tail = varlen_tail(p, kind);
  if (ctx.workspace.bytes < tail.bytes)  // Plan::run checked the plan's size; launch may be direct
    return Error::workspace_too_small(std::string(op) + ": cudnn_sdpa: workspace", tail.bytes,
                                      ctx.workspace.bytes);
  VarlenRun r;
  r.graph_ws = (ctx.workspace.bytes - tail.bytes) / 256 * 256;
  char* base = static_cast<char*>(ctx.workspace.data) + r.graph_ws;
  r.stats = reinterpret_cast<float*>(base);
  RaggedPrep& prep = r.prep;
  prep.cu_q = static_cast<const int32_t*>(cu_q.data);
  prep.cu_k = static_cast<const int32_t*>(cu_k.data);
  prep.batch = d.batch, prep.len_q = d.len_q, prep.len_k = d.len_k;
  prep.total_q = d.total_q, prep.total_k = d.total_k;
  prep.seq_q = reinterpret_cast<int32_t*>(base + tail.seq_q);
  prep.seq_kv = reinterpret_cast<int32_t*>(base + tail.seq_kv);
  for (const auto& [row, keys] : rows) {
    // The pass's offset vectors (their number sized the tail and names them in the pack).
    if (static_cast<size_t>(prep.count) == ragged_uids(kind).size()) break;
    RaggedTensor& t = prep.tensors[prep.count];
    t.row = row, t.keys = keys;
    t.off = reinterpret_cast<int32_t*>(base + tail.off +
                                       static_cast<size_t>(prep.count) * tail.off_bytes);
    ++prep.count;
  }
  return r;
}

// The variant pack's lengths and offsets of a varlen run.
void pack_ragged(std::unordered_map<int64_t, void*>& pack, const RaggedPrep& prep,
                 std::span<const int64_t> uids) {
  pack[kSeqQ] = prep.seq_q;
  pack[kSeqKV] = prep.seq_kv;
  for (size_t i = 0; i < uids.size(); ++i) pack[uids[i]] = prep.tensors[i].off;
}

// Packed sequences: the lengths and offsets first (in the workspace tail), the graph, then the
// LSE of every row out of cuDNN's statistics and the rows that see no key (cudnn_varlen.hpp).
Status launch_forward_varlen(const LaunchContext& ctx, const Problem& p,
                             const ForwardArguments& a) {
  const std::string_view op = attention::ForwardOp::name;
  const auto& d = p.desc;
  auto run = varlen_run(ctx, op, p, Kind::forward, a.cu_seqlens_q, a.cu_seqlens_k,
                        {{a.q.stride[0], false},
                         {a.k.stride[0], true},
                         {a.v.stride[0], true},
                         {a.y.stride[0], false},
                         {d.heads_q, false}});
  if (!run.ok()) return run.error();
  const RaggedPrep& prep = run->prep;
  Layout layout{{ragged(d.len_q, a.q.stride[0], a.q.stride[1]),
                 ragged(d.len_k, a.k.stride[0], a.k.stride[1]),
                 ragged(d.len_k, a.v.stride[0], a.v.stride[1]),
                 ragged(d.len_q, a.y.stride[0], a.y.stride[1]), ragged(d.len_q, d.heads_q, 1)}};
  std::unordered_map<int64_t, void*> pack{
      {kQ, w(a.q.data)}, {kK, w(a.k.data)}, {kV, w(a.v.data)}, {kO, a.y.data}, {kLse, run->stats}};
  pack_ragged(pack, prep, ragged_uids(Kind::forward));
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream.cuda_handle());
  BARACUDA_TRY(
      execute(ctx, op, p, Kind::forward, std::move(layout), std::move(pack), run->graph_ws, [&] {
        return cuda::check(op, "cudnn_sdpa: lengths and offsets", launch_ragged_prep(stream, prep));
      }));
  DeviceGuard guard(ctx.stream.device());
  RaggedRows rows;
  rows.y = a.y.data, rows.y_row = a.y.stride[0], rows.y_head = a.y.stride[1];
  rows.lse = static_cast<float*>(a.lse.data);
  rows.lse_head = a.lse.stride[0], rows.lse_row = a.lse.stride[1];
  rows.stats = run->stats, rows.off_stats = prep.tensors[kStatsOffset].off;
  rows.seq_q = prep.seq_q, rows.seq_kv = prep.seq_kv;
  rows.batch = d.batch, rows.heads = d.heads_q, rows.len_q = d.len_q, rows.dim_v = d.head_dim_v;
  rows.band = attention::detail::band_of(d.mask);
  return cuda::check(op, "cudnn_sdpa: rows' LSE", launch_ragged_rows(stream, rows));
}

// Whether the graph of `p` for `kind` and `layout` builds and fits `bytes` of workspace.
bool graph_fits(const Problem& p, Kind kind, int device, const Layout& layout, size_t bytes) {
  std::lock_guard lock(state().mu);
  const auto e = graph_locked(p, key_of(p, kind, device, layout));
  return e->graph && static_cast<uint64_t>(e->workspace) <= bytes;
}

// Packed self-attention (one cu_seqlens tensor for queries and keys, equal totals and longest
// lengths) gives every sequence Lq == Lk, where a bottom-right band is the same band top-left.
// cuDNN's ragged backward skips the key blocks a top-left causal mask removes but not those of a
// bottom-right one (H200, cuDNN 9.19, ninety-first session, the packed causal rows: 1.29 against
// 2.16 ms), so such a run takes the top-left graph where it fits the plan's workspace.
Problem top_left_if_same(const Problem& p, const BackwardArguments& a, Kind kind, int device,
                         const Layout& layout, size_t graph_ws) {
  const auto& d = p.desc;
  if (a.cu_seqlens_q.data != a.cu_seqlens_k.data || d.total_q != d.total_k || d.len_q != d.len_k ||
      d.mask.right < 0 || d.mask.diagonal != attention::Diagonal::bottom_right)
    return p;
  Problem t = p;
  t.desc.mask.diagonal = attention::Diagonal::top_left;
  return graph_fits(t, kind, device, layout, graph_ws) ? t : p;
}

// Packed sequences, backward: the lengths, offsets and cuDNN's statistics out of the caller's LSE
// first, the graph, then the rows of sequences with no query or no key (cudnn_varlen.hpp).
Status launch_backward_varlen(const LaunchContext& ctx, const Problem& p,
                              const BackwardArguments& a, Kind kind) {
  const std::string_view op = attention::BackwardOp::name;
  const auto& d = p.desc;
  auto run = varlen_run(ctx, op, p, kind, a.cu_seqlens_q, a.cu_seqlens_k,
                        {{a.q.stride[0], false},
                         {a.k.stride[0], true},
                         {a.v.stride[0], true},
                         {a.y.stride[0], false},
                         {d.heads_q, false},
                         {a.dy.stride[0], false},
                         {a.dq.stride[0], false},
                         {a.dk.stride[0], true},
                         {a.dv.stride[0], true}});
  if (!run.ok()) return run.error();
  RaggedPrep& prep = run->prep;
  prep.lse = static_cast<const float*>(a.lse.data);
  prep.lse_head = a.lse.stride[0], prep.lse_row = a.lse.stride[1], prep.heads_q = d.heads_q;
  prep.stats = run->stats;
  Layout layout{
      {ragged(d.len_q, a.q.stride[0], a.q.stride[1]), ragged(d.len_k, a.k.stride[0], a.k.stride[1]),
       ragged(d.len_k, a.v.stride[0], a.v.stride[1]), ragged(d.len_q, a.y.stride[0], a.y.stride[1]),
       ragged(d.len_q, d.heads_q, 1), ragged(d.len_q, a.dy.stride[0], a.dy.stride[1]),
       ragged(d.len_q, a.dq.stride[0], a.dq.stride[1]),
       ragged(d.len_k, a.dk.stride[0], a.dk.stride[1]),
       ragged(d.len_k, a.dv.stride[0], a.dv.stride[1])}};
  std::unordered_map<int64_t, void*> pack{
      {kQ, w(a.q.data)}, {kK, w(a.k.data)},  {kV, w(a.v.data)},
      {kO, w(a.y.data)}, {kLse, run->stats}, {kDO, w(a.dy.data)},
      {kDQ, a.dq.data},  {kDK, a.dk.data},   {kDV, a.dv.data}};
  pack_ragged(pack, prep, ragged_uids(kind));
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream.cuda_handle());
  const Problem graph_p = top_left_if_same(p, a, kind, ctx.stream.device(), layout, run->graph_ws);
  BARACUDA_TRY(
      execute(ctx, op, graph_p, kind, std::move(layout), std::move(pack), run->graph_ws, [&] {
        return cuda::check(op, "cudnn_sdpa: lengths, offsets and statistics",
                           launch_ragged_prep(stream, prep));
      }));
  DeviceGuard guard(ctx.stream.device());
  RaggedEmpty e;
  e.dq = a.dq.data, e.dk = a.dk.data, e.dv = a.dv.data;
  e.dq_row = a.dq.stride[0], e.dq_head = a.dq.stride[1];
  e.dk_row = a.dk.stride[0], e.dk_head = a.dk.stride[1];
  e.dv_row = a.dv.stride[0], e.dv_head = a.dv.stride[1];
  e.cu_q = prep.cu_q, e.cu_k = prep.cu_k, e.total_q = d.total_q, e.total_k = d.total_k;
  e.seq_q = prep.seq_q, e.seq_kv = prep.seq_kv;
  e.batch = d.batch, e.heads_q = d.heads_q, e.heads_kv = d.heads_kv;
  e.dim_qk = d.head_dim_qk, e.dim_v = d.head_dim_v;
  return cuda::check(op, "cudnn_sdpa: empty sequences' gradients", launch_ragged_empty(stream, e));
}

Status launch_forward(const LaunchContext& ctx, const Problem& p, const ForwardArguments& a) {
  if (p.desc.varlen) return launch_forward_varlen(ctx, p, a);
  const std::string_view op = attention::ForwardOp::name;
  Layout layout{{bhld_strides(a.q), bhld_strides(a.k), bhld_strides(a.v), bhld_strides(a.y),
                 lse_strides(as_const(a.lse))}};
  return execute(
      ctx, op, p, Kind::forward, std::move(layout),
      {{kQ, w(a.q.data)}, {kK, w(a.k.data)}, {kV, w(a.v.data)}, {kO, a.y.data}, {kLse, a.lse.data}},
      ctx.workspace.bytes);
}

Status launch_backward(const LaunchContext& ctx, const Problem& p, const BackwardArguments& a,
                       Kind kind) {
  if (p.desc.varlen) return launch_backward_varlen(ctx, p, a, kind);
  const std::string_view op = attention::BackwardOp::name;
  // The graph always reads a packed LSE: the caller's when it is packed, else a copy in the
  // workspace tail (after cuDNN's own region).
  const std::array<int64_t, 4> packed{p.desc.heads_q * p.desc.len_q, p.desc.len_q, 1, 1};
  const size_t lse_bytes = lse_pack_bytes(p);
  if (ctx.workspace.bytes < lse_bytes)  // Plan::run checked the plan's size; launch may be direct
    return Error::workspace_too_small(std::string(op) + ": cudnn_sdpa: workspace", lse_bytes,
                                      ctx.workspace.bytes);
  const size_t graph_ws = (ctx.workspace.bytes - lse_bytes) / 256 * 256;
  void* lse_copy = static_cast<char*>(ctx.workspace.data) + graph_ws;
  const bool copy = !lse_packed(p, a.lse);
  Layout layout{{bhld_strides(a.q), bhld_strides(a.k), bhld_strides(a.v), bhld_strides(a.y), packed,
                 bhld_strides(a.dy), bhld_strides(a.dq), bhld_strides(a.dk), bhld_strides(a.dv)}};
  return execute(ctx, op, p, kind, std::move(layout),
                 {{kQ, w(a.q.data)},
                  {kK, w(a.k.data)},
                  {kV, w(a.v.data)},
                  {kO, w(a.y.data)},
                  {kLse, copy ? lse_copy : w(a.lse.data)},
                  {kDO, w(a.dy.data)},
                  {kDQ, a.dq.data},
                  {kDK, a.dk.data},
                  {kDV, a.dv.data}},
                 graph_ws, [&]() -> Status {
                   return copy ? pack_lse(ctx, op, p, a.lse, lse_copy) : Status{};
                 });
}

// ---- Registration ------------------------------------------------------------------------------
// Two entries per (dtype, pass): one ranked ahead of the bespoke kernels where the measured table
// prefers cuDNN, one ranked behind them elsewhere (so only(Backend::cudnn) still reaches cuDNN).
// Forward: where the table prefers fa3_fwd_sm90a and it fits here, its own ranked-ahead entry runs
// and cuDNN ranks behind; where fa3 cannot run, the table's choice between cuDNN and the bespoke
// kernels stands.
template <bool Ahead>
bool fits_forward(const Problem& p, const DeviceCaps& c) {
  const bool ahead = preferred_candidate(p, Pass::forward, fa3_fits(p, c)) == Candidate::cudnn;
  return ahead == Ahead && fits_kind(p, c, Kind::forward);
}
template <bool Ahead, Kind K>
bool fits_backward(const Problem& p, const DeviceCaps& c) {
  // fa3_bwd_sm90a is not deterministic: the deterministic entries rank against the bespoke
  // (deterministic) kernels only.
  const bool fa3 = K == Kind::backward && fa3_fits(p, c, Pass::backward);
  const bool ahead = preferred_candidate(p, Pass::backward, fa3) == Candidate::cudnn;
  return ahead == Ahead && fits_kind(p, c, K);
}
// cuDNN's deterministic algorithm as the default backward: where kCudnnBwdDeterministicPicks says
// and fa3's entries would otherwise run (its rows were measured against fa3's ranked entry).
bool fits_backward_deterministic_default(const Problem& p, const DeviceCaps& c) {
  const bool fa3 = fa3_fits(p, c, Pass::backward);
  return cudnn_bwd_deterministic_default(p) && fa3 &&
         preferred_candidate(p, Pass::backward, fa3) != Candidate::bespoke &&
         fits_kind(p, c, Kind::backward_deterministic);
}
// Why cuDNN takes no problem of the pass (select's error under only(Backend::cudnn)): the rule
// cudnn_screen applies, no GPU it runs on, or cuDNN's own message where it refused the graph.
// nullopt where a graph was built (an entry stepped aside for its twin by the table's ranking).
// Registered on the ranked-behind entries only, so the error quotes it once.
template <Kind K>
std::optional<std::string> refusal(const Problem& p, const DeviceCaps& c) {
  if (auto why = cudnn_screen(p)) return why;
  if (K != Kind::forward)
    if (auto why = varlen_backward_refusal(p)) return why;
  if (!cudnn_serves(p, c)) return std::string("cuDNN's SDPA runs on GPUs from sm_80");
  return with_cached_entry(p, K, c.device, [](const Entry* e) -> std::optional<std::string> {
    if (!e || e->graph) return std::nullopt;
    return "cuDNN refused the graph: " + e->why;
  });
}
size_t ws_forward(const Problem& p, const DeviceCaps& c) {
  return workspace_kind(p, c, Kind::forward);
}
template <Kind K>
size_t ws_backward(const Problem& p, const DeviceCaps& c) {
  return workspace_kind(p, c, K);
}
template <Kind K>
Status run_backward(const LaunchContext& ctx, const Problem& p, const BackwardArguments& a) {
  return launch_backward(ctx, p, a, K);
}

PrecisionGuarantee precision(DType t, bool deterministic) {
  // Operands in the 16-bit type, products and softmax in f32; rows are tiled by cuDNN's own
  // heuristic choice, so a row's bits may depend on the problem shape (not bit_stable).
  return {t == DType::bf16 ? MathPrecision::bf16 : MathPrecision::f16, DType::f32, deterministic,
          false};
}

bool register_all() {
  using attention::BackwardOp;
  using attention::ForwardOp;
  for (DType t : {DType::bf16, DType::f16}) {
    auto sku = [t](std::string_view op, std::string_view name, bool det) {
      return KernelSku{.category = "attention",
                       .op = op,
                       .element = t,
                       .aux_element = DType::f32,
                       .layout = "strided",
                       .epilogue = "band_mask",
                       .arch = Arch::sm80,
                       .backend = Backend::cudnn,
                       .precision = precision(t, det),
                       .name = name};
    };
    register_kernel<ForwardOp>({.sku = sku(ForwardOp::name, "cudnn_sdpa", true),
                                .priority = kCudnnAhead,
                                .fits = fits_forward<true>,
                                .workspace = ws_forward,
                                .launch = launch_forward,
                                .check = check_forward});
    register_kernel<ForwardOp>({.sku = sku(ForwardOp::name, "cudnn_sdpa_ranked_behind", true),
                                .priority = kCudnnBehind,
                                .fits = fits_forward<false>,
                                .workspace = ws_forward,
                                .launch = launch_forward,
                                .check = check_forward,
                                .refusal = refusal<Kind::forward>});
    // cuDNN's default backward accumulates dQ with float atomics (not deterministic); its
    // deterministic algorithm is registered separately, lower (kCudnnDeterministicAhead: fa3's
    // ranked deterministic entry sits between the two).
    register_kernel<BackwardOp>({.sku = sku(BackwardOp::name, "cudnn_sdpa_bwd", false),
                                 .priority = kCudnnAhead,
                                 .fits = fits_backward<true, Kind::backward>,
                                 .workspace = ws_backward<Kind::backward>,
                                 .launch = run_backward<Kind::backward>,
                                 .check = check_backward});
    register_kernel<BackwardOp>({.sku = sku(BackwardOp::name, "cudnn_sdpa_bwd_deterministic", true),
                                 .priority = kCudnnDeterministicAhead,
                                 .fits = fits_backward<true, Kind::backward_deterministic>,
                                 .workspace = ws_backward<Kind::backward_deterministic>,
                                 .launch = run_backward<Kind::backward_deterministic>,
                                 .check = check_backward});
    // The same algorithm as the default where its rows say (above fa3's entries there).
    register_kernel<BackwardOp>({.sku = sku(BackwardOp::name, kCudnnBwdDeterministicDefault, true),
                                 .priority = kCudnnDetDefaultAhead,
                                 .fits = fits_backward_deterministic_default,
                                 .workspace = ws_backward<Kind::backward_deterministic>,
                                 .launch = run_backward<Kind::backward_deterministic>,
                                 .check = check_backward});
    register_kernel<BackwardOp>(
        {.sku = sku(BackwardOp::name, "cudnn_sdpa_bwd_ranked_behind", false),
         .priority = kCudnnBehind,
         .fits = fits_backward<false, Kind::backward>,
         .workspace = ws_backward<Kind::backward>,
         .launch = run_backward<Kind::backward>,
         .check = check_backward,
         .refusal = refusal<Kind::backward>});
    register_kernel<BackwardOp>(
        {.sku = sku(BackwardOp::name, "cudnn_sdpa_bwd_deterministic_ranked_behind", true),
         .priority = kCudnnBehind - 1,
         .fits = fits_backward<false, Kind::backward_deterministic>,
         .workspace = ws_backward<Kind::backward_deterministic>,
         .launch = run_backward<Kind::backward_deterministic>,
         .check = check_backward,
         .refusal = refusal<Kind::backward_deterministic>});
  }
  return true;
}
BARACUDA_REGISTER(register_all());

}  // namespace

std::optional<int64_t> cudnn_loaded_version() {
  return static_cast<int64_t>(cudnnGetVersion());
}

std::optional<CudnnTuning> cudnn_tuning(const attention::Problem& p, Pass pass, bool deterministic,
                                        int device) {
  const Kind kind = pass == Pass::forward ? Kind::forward
                    : deterministic       ? Kind::backward_deterministic
                                          : Kind::backward;
  return with_cached_entry(p, kind, device, [](const Entry* e) -> std::optional<CudnnTuning> {
    if (!e || !e->graph) return std::nullopt;
    return CudnnTuning{e->timed, e->plan};
  });
}

bool cudnn_serves(const attention::Problem& p, const DeviceCaps& caps) {
  return caps.device >= 0 && caps.sm >= 80 && !cudnn_screen(p).has_value();
}

}  // namespace baracuda::attention_hopper

// The float64 CPU reference: materialized scores and softmax per query row, forward and backward.
// It is the test oracle and the backend for CPU streams (every floating dtype).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "baracuda/ops/attention.hpp"
#include "core/cpu/parallel.hpp"
#include "ops/attention/common.hpp"
#include "ops/attention/reference.hpp"

namespace baracuda::attention {
namespace {

using detail::Band;
using detail::lse_offset;
using detail::row_offset;

struct Seq {
  int64_t q0 = 0, lq = 0, k0 = 0, lk = 0;  // first packed row (0 when padded) and lengths
  const int32_t* pages = nullptr;          // paged K / V: the sequence's block-table row
};

// Where a sequence's keys live in K or V (strides st): padded or packed rows, or pool pages.
struct KeyRows {
  const Problem& p;
  const int64_t* st;
  const Seq& s;
  int64_t operator()(int64_t b, int64_t h, int64_t j) const {
    return s.pages
               ? detail::paged_row_offset(st, s.pages, static_cast<int>(p.desc.page_size),
                                          static_cast<int>(p.desc.pages), h, static_cast<int>(j))
               : row_offset(st, p.desc.varlen, b, h, s.k0 + j);
  }
};

// Sequence b's rows before seqused_k. With varlen the offsets come from host cu_seqlens, checked
// here because the descriptor cannot know them.
Result<Seq> rows_of(std::string_view op, const Problem& p, const ConstTensor& cu_q,
                    const ConstTensor& cu_k, int64_t b) {
  const Descriptor& d = p.desc;
  if (!d.varlen) return Seq{0, d.len_q, 0, d.len_k};
  const auto* cq = static_cast<const int32_t*>(cu_q.data);
  const auto* ck = static_cast<const int32_t*>(cu_k.data);
  const std::pair<const char*, const int32_t*> arrays[] = {{"cu_seqlens_q", cq},
                                                           {"cu_seqlens_k", ck}};
  for (const auto& [what, c] : arrays) {
    const int64_t total = c == cq ? d.total_q : d.total_k;
    const int64_t max_len = c == cq ? d.len_q : d.len_k;
    const int64_t s = c[b], e = c[b + 1];
    if (s < 0 || s > e || e > total || e - s > max_len)
      return Error::invalid(std::string(op) + ": " + what + "[" + std::to_string(b) + ".." +
                            std::to_string(b + 1) + "]=(" + std::to_string(s) + "," +
                            std::to_string(e) + "): needs 0 <= start <= end <= total (" +
                            std::to_string(total) + ") and end - start <= max length (" +
                            std::to_string(max_len) + ")");
  }
  return Seq{cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b]};
}

// Sequence b's rows. With varlen the offsets come from host cu_seqlens, and with seqused_k the
// key count from a host array: checked here because the descriptor cannot know them.
Result<Seq> sequence(std::string_view op, const Problem& p, const ConstTensor& cu_q,
                     const ConstTensor& cu_k, int64_t b, const ConstTensor& used_k = {},
                     const ConstTensor& table = {}) {
  Result<Seq> r = rows_of(op, p, cu_q, cu_k, b);
  if (!r.ok()) return r;
  Seq s = r.value();
  if (p.desc.seqused_k) {
    const int32_t used = static_cast<const int32_t*>(used_k.data)[b];
    if (used < 0 || used > s.lk)
      return Error::invalid(std::string(op) + ": seqused_k[" + std::to_string(b) +
                            "]=" + std::to_string(used) + ": needs 0 <= count <= the sequence's " +
                            std::to_string(s.lk) + " keys");
    s.lk = used;
  }
  if (p.desc.page_size > 0) {  // the pages holding the sequence's keys must be in the pools
    const int64_t cols = shapes_of(p).block_table[1];
    s.pages = static_cast<const int32_t*>(table.data) + b * cols;
    for (int64_t c = 0; c * p.desc.page_size < s.lk; ++c)
      if (s.pages[c] < 0 || s.pages[c] >= p.desc.pages)
        return Error::invalid(std::string(op) + ": block_table[" + std::to_string(b) + "][" +
                              std::to_string(c) + "]=" + std::to_string(s.pages[c]) +
                              ": needs 0 <= page < pages (" + std::to_string(p.desc.pages) + ")");
  }
  return s;
}

// Rows [first, last) of one head of a tensor as float64, row j's `dim` values at row(j): each
// element is loaded (a dtype dispatch) once, where the loops below would load a key row again for
// every query row that sees it. Exact conversions, so the sums are the same to the bit.
struct RowsF64 {
  std::vector<double> v;
  int64_t first = 0, dim = 0;
  const double* row(int64_t j) const { return v.data() + (j - first) * dim; }
};
template <class Offset>
void load_rows(RowsF64& r, const void* data, DType t, int64_t dim, int64_t first, int64_t last,
               Offset offset_of) {
  r.first = first, r.dim = dim;
  r.v.resize(static_cast<size_t>(std::max<int64_t>(last - first, 0) * dim));
  for (int64_t j = first; j < last; ++j) {
    const int64_t o = offset_of(j);
    double* dst = r.v.data() + (j - first) * dim;
    for (int64_t c = 0; c < dim; ++c) dst[c] = load_as_double(data, t, o + c);
  }
}
void load_row(std::vector<double>& r, const void* data, DType t, int64_t offset, int64_t dim) {
  r.resize(static_cast<size_t>(dim));
  for (int64_t c = 0; c < dim; ++c) r[c] = load_as_double(data, t, offset + c);
}

// Scores of one query row `q` against its visible keys [lo, hi) of `k` (post scale and soft-cap),
// and the derivative of each capped score w.r.t. the scaled raw score (1 without capping).
// qk_descale: e4m3 inputs' q_descale * k_descale (1 otherwise).
void scores(const Problem& p, const std::vector<double>& q, const RowsF64& k, int64_t lo,
            int64_t hi, std::vector<double>& out, std::vector<double>& dcap,
            double qk_descale = 1) {
  const int64_t dk = p.desc.head_dim_qk;
  out.assign(hi - lo, 0.0);
  dcap.assign(hi - lo, 1.0);
  for (int64_t j = lo; j < hi; ++j) {
    const double* kr = k.row(j);
    double acc = 0;
    for (int64_t c = 0; c < dk; ++c) acc += q[c] * kr[c];
    double v = acc * qk_descale * p.scale;
    if (p.desc.softcap > 0) {
      const double th = std::tanh(v / p.desc.softcap);
      v = p.desc.softcap * th;
      dcap[j - lo] = 1.0 - th * th;
    }
    out[j - lo] = v;
  }
}

// Softmax in place over `s`; returns the log-sum-exp.
double softmax(std::vector<double>& s) {
  double m = -std::numeric_limits<double>::infinity();
  for (double v : s) m = std::max(m, v);
  double sum = 0;
  for (double& v : s) sum += (v = std::exp(v - m));
  for (double& v : s) v /= sum;
  return m + std::log(sum);
}

// An e4m3 input's dequantization scale (a host f32 scalar); 1 for other dtypes.
double descale(const Problem& p, const ConstTensor& t) {
  return p.desc.dtype == DType::e4m3 ? *static_cast<const float*>(t.data) : 1.0;
}

// Rows [i_begin, i_end) of query head h of sequence b (already validated).
void forward_rows(const Problem& p, const ForwardArguments& a, const Seq& sq, int64_t b, int64_t h,
                  int64_t i_begin, int64_t i_end) {
  const Descriptor& d = p.desc;
  const DType t = d.dtype;
  const Band band = detail::band_of(d.mask);
  const int64_t hk = h / p.group;
  const double qk_descale = descale(p, a.q_descale) * descale(p, a.k_descale);
  const double v_descale = descale(p, a.v_descale);
  // The keys any of the rows sees (each row's band within them), as float64 once.
  int64_t k_first = sq.lk, k_last = 0;
  for (int64_t i = i_begin; i < i_end; ++i) {
    int64_t lo, hi;
    detail::visible_keys(band, i, sq.lq, sq.lk, &lo, &hi);
    if (lo < hi) k_first = std::min(k_first, lo), k_last = std::max(k_last, hi);
  }
  RowsF64 k_rows, v_rows;
  const KeyRows k_at{p, a.k.stride.data(), sq}, v_at{p, a.v.stride.data(), sq};
  load_rows(k_rows, a.k.data, t, d.head_dim_qk, k_first, k_last,
            [&](int64_t j) { return k_at(b, hk, j); });
  load_rows(v_rows, a.v.data, t, d.head_dim_v, k_first, k_last,
            [&](int64_t j) { return v_at(b, hk, j); });
  std::vector<double> q, s, dcap, acc(d.head_dim_v);
  for (int64_t i = i_begin; i < i_end; ++i) {
    int64_t lo, hi;
    detail::visible_keys(band, i, sq.lq, sq.lk, &lo, &hi);
    const int64_t qo = row_offset(a.q.stride.data(), d.varlen, b, h, sq.q0 + i);
    const int64_t yo = row_offset(a.y.stride.data(), d.varlen, b, h, sq.q0 + i);
    std::fill(acc.begin(), acc.end(), 0.0);
    double lse = -std::numeric_limits<double>::infinity();
    if (lo < hi) {
      load_row(q, a.q.data, t, qo, d.head_dim_qk);
      scores(p, q, k_rows, lo, hi, s, dcap, qk_descale);
      lse = softmax(s);
      for (int64_t j = lo; j < hi; ++j) {
        const double* vr = v_rows.row(j);
        for (int64_t c = 0; c < d.head_dim_v; ++c) acc[c] += s[j - lo] * v_descale * vr[c];
      }
    }
    for (int64_t c = 0; c < d.head_dim_v; ++c)
      store_from_double(a.y.data, p.y_dtype, yo + c, acc[c]);
    store_from_double(a.lse.data, p.lse_dtype,
                      lse_offset(a.lse.stride.data(), d.varlen, b, h, sq.q0 + i), lse);
  }
}

// Every sequence's rows, all checked before anything is written.
template <class Args>
Result<std::vector<Seq>> sequences(std::string_view op, const Problem& p, const Args& a,
                                   const ConstTensor& used_k = {}, const ConstTensor& table = {}) {
  std::vector<Seq> out;
  out.reserve(static_cast<size_t>(p.desc.batch));
  for (int64_t b = 0; b < p.desc.batch; ++b) {
    auto r = sequence(op, p, a.cu_seqlens_q, a.cu_seqlens_k, b, used_k, table);
    if (!r.ok()) return r.error();
    out.push_back(r.value());
  }
  return out;
}

// Threads for a pass over `seqs` (0: cpu_threads()). The heads are independent with disjoint
// outputs and each runs whole on one thread (cpu::parallel_for), so the bits do not depend on the
// count; below ~4M multiply-adds a thread's start-up would cost more than it saves.
int64_t threads_for(const Problem& p, const std::vector<Seq>& seqs) {
  double work = 0;
  for (const Seq& s : seqs)
    work += static_cast<double>(s.lq) * static_cast<double>(s.lk) *
            static_cast<double>(p.desc.head_dim_qk + p.desc.head_dim_v);
  return work * static_cast<double>(p.desc.heads_q) < 4e6 ? 1 : 0;
}

Status forward(const LaunchContext&, const Problem& p, const ForwardArguments& a) {
  const Descriptor& d = p.desc;
  auto seqs = sequences(ForwardOp::name, p, a, a.seqused_k, a.block_table);
  if (!seqs.ok()) return seqs.error();
  const std::vector<Seq>& sq = seqs.value();
  cpu::parallel_for(
      d.batch * d.heads_q,
      [&](int64_t i) {
        const int64_t b = i / d.heads_q, h = i % d.heads_q;
        forward_rows(p, a, sq[static_cast<size_t>(b)], b, h, 0, sq[static_cast<size_t>(b)].lq);
      },
      threads_for(p, sq));
  return {};
}

// dK, dV of key head hk of sequence b (summed over its query heads) and those heads' dQ.
void backward_head(const Problem& p, const BackwardArguments& a, const Seq& sq, int64_t b,
                   int64_t hk) {
  const Descriptor& d = p.desc;
  const DType t = d.dtype;
  const Band band = detail::band_of(d.mask);
  const int64_t dk = d.head_dim_qk, dv = d.head_dim_v;
  std::vector<double> s, dcap, dp, dq(dk), gk, gv, q, g, y;
  RowsF64 k_rows, v_rows;
  gk.assign(sq.lk * dk, 0.0);  // dK, dV of this key head, summed over its query heads
  gv.assign(sq.lk * dv, 0.0);
  const KeyRows k_at{p, a.k.stride.data(), sq}, v_at{p, a.v.stride.data(), sq};
  load_rows(k_rows, a.k.data, t, dk, 0, sq.lk, [&](int64_t j) { return k_at(b, hk, j); });
  load_rows(v_rows, a.v.data, t, dv, 0, sq.lk, [&](int64_t j) { return v_at(b, hk, j); });
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    for (int64_t i = 0; i < sq.lq; ++i) {
      int64_t lo, hi;
      detail::visible_keys(band, i, sq.lq, sq.lk, &lo, &hi);
      const int64_t qo = row_offset(a.q.stride.data(), d.varlen, b, h, sq.q0 + i);
      const int64_t go = row_offset(a.dy.stride.data(), d.varlen, b, h, sq.q0 + i);
      std::fill(dq.begin(), dq.end(), 0.0);
      const double lse = load_as_double(a.lse.data, p.lse_dtype,
                                        lse_offset(a.lse.stride.data(), d.varlen, b, h, sq.q0 + i));
      if (lo < hi && std::isfinite(lse)) {
        // Like the kernels, the backward is defined from the saved Y and LSE: P = exp(S - LSE)
        // and delta = dY . Y (= sum_j P_j dP_j when Y and LSE are the forward's).
        load_row(q, a.q.data, t, qo, dk);
        load_row(g, a.dy.data, t, go, dv);
        load_row(y, a.y.data, t, row_offset(a.y.stride.data(), d.varlen, b, h, sq.q0 + i), dv);
        scores(p, q, k_rows, lo, hi, s, dcap);
        for (double& v : s) v = std::exp(v - lse);
        double delta = 0;
        for (int64_t c = 0; c < dv; ++c) delta += g[c] * y[c];
        dp.assign(hi - lo, 0.0);
        for (int64_t j = lo; j < hi; ++j) {
          const double* vr = v_rows.row(j);
          double acc = 0;
          for (int64_t c = 0; c < dv; ++c) acc += g[c] * vr[c];
          dp[j - lo] = acc;
        }
        for (int64_t j = lo; j < hi; ++j) {
          const double pj = s[j - lo];
          // d(score before capping, after scale) then chain through the scale to Q and K.
          const double ds = pj * (dp[j - lo] - delta) * dcap[j - lo] * p.scale;
          const double* kr = k_rows.row(j);
          for (int64_t c = 0; c < dk; ++c) {
            dq[c] += ds * kr[c];
            gk[j * dk + c] += ds * q[c];
          }
          for (int64_t c = 0; c < dv; ++c) gv[j * dv + c] += pj * g[c];
        }
      }
      const int64_t dqo = row_offset(a.dq.stride.data(), d.varlen, b, h, sq.q0 + i);
      for (int64_t c = 0; c < dk; ++c) store_from_double(a.dq.data, t, dqo + c, dq[c]);
    }
  }
  for (int64_t j = 0; j < sq.lk; ++j) {
    const int64_t ko = row_offset(a.dk.stride.data(), d.varlen, b, hk, sq.k0 + j);
    const int64_t vo = row_offset(a.dv.stride.data(), d.varlen, b, hk, sq.k0 + j);
    for (int64_t c = 0; c < dk; ++c) store_from_double(a.dk.data, t, ko + c, gk[j * dk + c]);
    for (int64_t c = 0; c < dv; ++c) store_from_double(a.dv.data, t, vo + c, gv[j * dv + c]);
  }
}

Status backward(const LaunchContext&, const Problem& p, const BackwardArguments& a) {
  const Descriptor& d = p.desc;
  auto seqs = sequences(BackwardOp::name, p, a);
  if (!seqs.ok()) return seqs.error();
  const std::vector<Seq>& sq = seqs.value();
  cpu::parallel_for(
      d.batch * d.heads_kv,
      [&](int64_t i) {
        const int64_t b = i / d.heads_kv;
        backward_head(p, a, sq[static_cast<size_t>(b)], b, i % d.heads_kv);
      },
      threads_for(p, sq));
  return {};
}

constexpr PrecisionGuarantee kReference{MathPrecision::f64, DType::f64, true, true};

template <class Op, class Launch>
bool register_reference(DType t, std::string_view op, Launch launch) {
  return register_kernel<Op>({
      .sku = {.category = "attention",
              .op = op,
              .element = t,
              .aux_element = t,
              .layout = "strided",
              .epilogue = "any_mask",
              .arch = Arch::cpu,
              .backend = Backend::cpu_reference,
              .precision = kReference,
              .name = "reference"},
      .priority = 0,
      .launch = launch,
  });
}

bool register_all() {
  for (DType t : {DType::f16, DType::bf16, DType::f32, DType::f32_strict, DType::f64}) {
    register_reference<ForwardOp>(t, ForwardOp::name, forward);
    register_reference<BackwardOp>(t, BackwardOp::name, backward);
  }
  register_reference<ForwardOp>(DType::e4m3, ForwardOp::name, forward);  // fp8: forward only
  return true;
}
BARACUDA_REGISTER(register_all());

}  // namespace

Status detail::reference_forward_rows(const Problem& p, const ForwardArguments& a, int64_t b,
                                      int64_t h, int64_t i_begin, int64_t i_end) {
  BARACUDA_TRY(ForwardOp::check_arguments(p, a, Location::host()));
  if (b < 0 || b >= p.desc.batch || h < 0 || h >= p.desc.heads_q)
    return Error::invalid(std::string(ForwardOp::name) + ": reference rows: (b=" +
                          std::to_string(b) + ", h=" + std::to_string(h) + ") out of range");
  auto sq =
      sequence(ForwardOp::name, p, a.cu_seqlens_q, a.cu_seqlens_k, b, a.seqused_k, a.block_table);
  if (!sq.ok()) return sq.error();
  const int64_t lq = sq.value().lq;
  forward_rows(p, a, sq.value(), b, h, std::clamp<int64_t>(i_begin, 0, lq),
               std::clamp<int64_t>(i_end, 0, lq));
  return {};
}

}  // namespace baracuda::attention

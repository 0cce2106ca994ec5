// Descriptor and argument rules of the attention family (forward and backward share them).
#include <cmath>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>

#include "baracuda/core/validate.hpp"
#include "baracuda/ops/attention.hpp"

namespace baracuda::attention {
namespace {

constexpr int64_t kMaxHeadDim = 256;

std::string num(int64_t v) {
  return std::to_string(v);
}
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Result<Problem> make(std::string_view op, const Descriptor& d) {
  const std::string o(op);
  switch (d.dtype) {
    case DType::f16:
    case DType::bf16:
    case DType::f32:
    case DType::f32_strict:
    case DType::f64:
      break;
    case DType::e4m3:
      if (op == BackwardOp::name)
        return Error::unsupported(o + ": dtype=e4m3: fp8 attention is forward only");
      break;
    case DType::e5m2:
      return Error::unsupported(o + ": dtype=e5m2: fp8 attention takes e4m3 Q, K and V");
    default:
      return Error::invalid(o + ": dtype=" + std::string(name(d.dtype)) +
                            ": attention needs a floating-point dtype");
  }
  const std::pair<const char*, int64_t> extents[] = {
      {"batch", d.batch},           {"heads_q", d.heads_q}, {"heads_kv", d.heads_kv},
      {"len_q", d.len_q},           {"len_k", d.len_k},     {"head_dim_qk", d.head_dim_qk},
      {"head_dim_v", d.head_dim_v}, {"total_q", d.total_q}, {"total_k", d.total_k}};
  for (const auto& [what, v] : extents)
    if (v < 0) return Error::invalid(o + ": " + what + "=" + num(v) + " is negative");
  if (d.heads_kv == 0 && d.heads_q > 0)
    return Error::invalid(o + ": heads_kv=0 with heads_q=" + num(d.heads_q) +
                          ": every query head needs a key/value head");
  if (d.heads_kv > 0 && d.heads_q % d.heads_kv != 0)
    return Error::invalid(o + ": heads_q=" + num(d.heads_q) + " is not a multiple of heads_kv=" +
                          num(d.heads_kv) + " (GQA groups must be equal)");
  if (d.head_dim_qk == 0 || d.head_dim_v == 0)
    return Error::invalid(o + ": head_dim_qk=" + num(d.head_dim_qk) +
                          ", head_dim_v=" + num(d.head_dim_v) + ": head dims must be positive");
  if (d.head_dim_qk > kMaxHeadDim || d.head_dim_v > kMaxHeadDim)
    return Error::unsupported(o + ": head_dim_qk=" + num(d.head_dim_qk) +
                              ", head_dim_v=" + num(d.head_dim_v) + ": head dims above " +
                              num(kMaxHeadDim) + " are not supported");
  if (d.scale && !std::isfinite(*d.scale))
    return Error::invalid(o + ": scale=" + num(*d.scale) + " is not finite");
  if (!std::isfinite(d.softcap) || d.softcap < 0)
    return Error::invalid(o + ": softcap=" + num(d.softcap) +
                          " must be finite and >= 0 (0 turns capping off)");
  if (d.mask.left < -1 || d.mask.right < -1)
    return Error::invalid(o + ": mask=(" + num(d.mask.left) + "," + num(d.mask.right) +
                          "): window bounds must be >= 0, or -1 for unbounded");
  if (d.page_size < 0 || d.pages < 0)
    return Error::invalid(o + ": page_size=" + num(d.page_size) + ", pages=" + num(d.pages) +
                          ": must be >= 0 (page_size 0: K / V not paged)");
  if (d.page_size == 0 && d.pages != 0)
    return Error::invalid(o + ": pages=" + num(d.pages) +
                          " with page_size=0: pages are only meaningful for paged K / V");
  if (d.page_size > 0) {
    if (op == BackwardOp::name)
      return Error::unsupported(o + ": page_size=" + num(d.page_size) +
                                ": paged K / V are forward only (the backward takes varlen)");
    if (d.pages == 0 && d.len_k > 0)
      return Error::invalid(o + ": pages=0 with page_size=" + num(d.page_size) +
                            " and len_k=" + num(d.len_k) + ": the sequences' keys need pages");
    if (d.page_size > INT32_MAX || d.pages > INT32_MAX)
      return Error::unsupported(o + ": page_size=" + num(d.page_size) + ", pages=" + num(d.pages) +
                                ": each must fit 2^31-1");
  }
  if (d.seqused_k && op == BackwardOp::name)
    return Error::unsupported(o + ": seqused_k: per-sequence key counts are forward only (the " +
                              "backward takes whole sequences: varlen with cu_seqlens_k)");
  if (d.varlen) {
    if (d.len_q > d.total_q || d.len_k > d.total_k)
      return Error::invalid(o + ": varlen: max lengths (len_q=" + num(d.len_q) + ", len_k=" +
                            num(d.len_k) + ") exceed the packed totals (total_q=" + num(d.total_q) +
                            ", total_k=" + num(d.total_k) + ")");
  } else if (d.total_q != 0 || d.total_k != 0) {
    return Error::invalid(o + ": total_q=" + num(d.total_q) + ", total_k=" + num(d.total_k) +
                          ": totals are only meaningful with varlen=true");
  }
  // Kernels index with 32-bit lengths and head counts; every tensor's element count must fit int64.
  const std::pair<const char*, int64_t> indexable[] = {
      {"len_q", d.len_q},     {"len_k", d.len_k},     {"heads_q", d.heads_q},
      {"total_q", d.total_q}, {"total_k", d.total_k}, {"batch", d.batch}};
  for (const auto& [what, v] : indexable)
    if (v > INT32_MAX)
      return Error::unsupported(o + ": " + what + "=" + num(v) + " exceeds 2^31-1");
  const bool fp8 = d.dtype == DType::e4m3;
  const DType y_dtype = d.out_dtype.value_or(fp8 ? DType::bf16 : d.dtype);
  if (fp8 ? y_dtype != DType::bf16 && y_dtype != DType::f16 : y_dtype != d.dtype)
    return Error::invalid(o + ": out_dtype=" + std::string(name(y_dtype)) +
                          " with dtype=" + std::string(name(d.dtype)) +
                          (fp8 ? ": e4m3 attention writes bf16 or f16"
                               : ": Y has the inputs' dtype (only e4m3 inputs take another)"));
  Problem p;
  p.desc = d;
  p.y_dtype = y_dtype;
  p.scale = d.scale ? *d.scale : 1.0 / std::sqrt(static_cast<double>(d.head_dim_qk));
  p.group = d.heads_kv > 0 ? d.heads_q / d.heads_kv : 1;
  p.lse_dtype = d.dtype == DType::f64 ? DType::f64 : DType::f32;
  const Shapes s = shapes_of(p);
  for (auto [what, dims] : {std::pair{"q", s.q}, {"y", s.y}})
    BARACUDA_TRY(validate::shape(op, what, std::span<const int64_t>(dims, s.rank_qkv)));
  for (auto [what, dims] : {std::pair{"k", s.k}, {"v", s.v}})
    BARACUDA_TRY(validate::shape(op, what, std::span<const int64_t>(dims, s.rank_kv)));
  BARACUDA_TRY(validate::shape(op, "lse", std::span<const int64_t>(s.lse, s.rank_lse)));
  return p;
}

// Shape, dtype, extent, placement, and the unit-stride head-dim axis the kernels vectorize along.
template <class Ptr>
Status qkv_tensor(std::string_view op, std::string_view arg, const BasicTensor<Ptr>& t,
                  const Problem& p, const int64_t* dims, int rank, Location where, bool input,
                  std::optional<DType> dtype = std::nullopt) {
  BARACUDA_TRY(validate::tensor(op, arg, t, dtype.value_or(p.desc.dtype),
                                std::span<const int64_t>(dims, rank), where,
                                {.allow_broadcast = input}));
  if (t.stride[rank - 1] != 1 && dims[rank - 1] > 1)
    return Error::invalid(std::string(op) + ": " + std::string(arg) + ": stride[" +
                          num(int64_t{rank - 1}) + "]=" + num(t.stride[rank - 1]) +
                          ": the head-dim axis must be unit-stride");
  return {};
}

Status seqlens(std::string_view op, const Problem& p, const ConstTensor& cu_q,
               const ConstTensor& cu_k, Location where) {
  const Shapes s = shapes_of(p);
  if (!p.desc.varlen) {
    if (cu_q.data || cu_k.data)
      return Error::invalid(std::string(op) +
                            ": cu_seqlens_q/cu_seqlens_k given but the descriptor is not varlen");
    return {};
  }
  const int64_t dims[] = {s.cu_seqlens};
  BARACUDA_TRY(validate::tensor(op, "cu_seqlens_q", cu_q, DType::i32, dims, where,
                                {.require_contiguous = true}));
  return validate::tensor(op, "cu_seqlens_k", cu_k, DType::i32, dims, where,
                          {.require_contiguous = true});
}

// Paged K / V's block table: i32 [B, ceil(Lk / page_size)], row-major, on the plan's device.
Status block_table(std::string_view op, const Problem& p, const ConstTensor& table,
                   Location where) {
  if (p.desc.page_size == 0) {
    if (table.data)
      return Error::invalid(std::string(op) +
                            ": block_table given but the descriptor's page_size is 0 (not paged)");
    return {};
  }
  const Shapes s = shapes_of(p);
  return validate::tensor(op, "block_table", table, DType::i32, s.block_table, where,
                          {.require_contiguous = true});
}

// Descriptor::seqused_k's per-sequence key counts: i32 [B], contiguous, on the plan's device.
Status seqused(std::string_view op, const Problem& p, const ConstTensor& used, Location where) {
  if (!p.desc.seqused_k) {
    if (used.data)
      return Error::invalid(std::string(op) +
                            ": seqused_k given but the descriptor's seqused_k is false");
    return {};
  }
  const int64_t dims[] = {p.desc.batch};
  return validate::tensor(op, "seqused_k", used, DType::i32, dims, where,
                          {.require_contiguous = true});
}

}  // namespace

std::string to_string(const Mask& m) {
  if (m.is_none()) return "none";
  const char* diag = m.diagonal == Diagonal::top_left ? "top_left" : "bottom_right";
  if (m.is_causal()) return std::string("causal_") + diag;
  return "window(" + num(m.left) + "," + num(m.right) + "," + diag + ")";
}

Shapes shapes_of(const Problem& p) {
  const Descriptor& d = p.desc;
  Shapes s;
  if (d.varlen) {
    s.rank_qkv = 3;
    s.rank_lse = 2;
    const int64_t q[] = {d.total_q, d.heads_q, d.head_dim_qk},
                  k[] = {d.total_k, d.heads_kv, d.head_dim_qk},
                  v[] = {d.total_k, d.heads_kv, d.head_dim_v},
                  y[] = {d.total_q, d.heads_q, d.head_dim_v};
    for (int i = 0; i < 3; ++i) s.q[i] = q[i], s.k[i] = k[i], s.v[i] = v[i], s.y[i] = y[i];
    s.q[3] = s.k[3] = s.v[3] = s.y[3] = 0;
    s.rank_kv = 3;
    s.lse[0] = d.heads_q, s.lse[1] = d.total_q, s.lse[2] = 0;
    s.cu_seqlens = d.batch + 1;
  } else {
    const int64_t q[] = {d.batch, d.heads_q, d.len_q, d.head_dim_qk},
                  k[] = {d.batch, d.heads_kv, d.len_k, d.head_dim_qk},
                  v[] = {d.batch, d.heads_kv, d.len_k, d.head_dim_v},
                  y[] = {d.batch, d.heads_q, d.len_q, d.head_dim_v};
    for (int i = 0; i < 4; ++i) s.q[i] = q[i], s.k[i] = k[i], s.v[i] = v[i], s.y[i] = y[i];
    s.lse[0] = d.batch, s.lse[1] = d.heads_q, s.lse[2] = d.len_q;
  }
  if (d.page_size > 0) {  // K / V are page pools; a block table row per sequence
    const int64_t k[] = {d.pages, d.heads_kv, d.page_size, d.head_dim_qk},
                  v[] = {d.pages, d.heads_kv, d.page_size, d.head_dim_v};
    for (int i = 0; i < 4; ++i) s.k[i] = k[i], s.v[i] = v[i];
    s.rank_kv = 4;
    s.block_table[0] = d.batch;
    s.block_table[1] = (d.len_k + d.page_size - 1) / d.page_size;
  }
  return s;
}

Result<Problem> ForwardOp::make_problem(const Descriptor& d) {
  return make(name, d);
}
Result<Problem> BackwardOp::make_problem(const Descriptor& d) {
  return make(name, d);
}

Status ForwardOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const Shapes s = shapes_of(p);
  const int r = s.rank_qkv;
  BARACUDA_TRY(qkv_tensor(name, "q", a.q, p, s.q, r, where, true));
  BARACUDA_TRY(qkv_tensor(name, "k", a.k, p, s.k, s.rank_kv, where, true));
  BARACUDA_TRY(qkv_tensor(name, "v", a.v, p, s.v, s.rank_kv, where, true));
  BARACUDA_TRY(qkv_tensor(name, "y", a.y, p, s.y, r, where, false, p.y_dtype));
  BARACUDA_TRY(validate::tensor(name, "lse", a.lse, p.lse_dtype,
                                std::span<const int64_t>(s.lse, s.rank_lse), where));
  BARACUDA_TRY(seqlens(name, p, a.cu_seqlens_q, a.cu_seqlens_k, where));
  BARACUDA_TRY(seqused(name, p, a.seqused_k, where));
  BARACUDA_TRY(block_table(name, p, a.block_table, where));
  for (auto [what, t] : {std::pair{"seqused_k", a.seqused_k}, {"block_table", a.block_table}}) {
    if (!t.data) continue;
    BARACUDA_TRY(validate::no_overlap(name, "y", a.y, what, t));
    BARACUDA_TRY(validate::no_overlap(name, "lse", a.lse, what, t));
  }
  const std::pair<const char*, ConstTensor> descales[] = {
      {"q_descale", a.q_descale}, {"k_descale", a.k_descale}, {"v_descale", a.v_descale}};
  for (const auto& [what, t] : descales) {
    if (p.desc.dtype != DType::e4m3) {
      if (t.data)
        return Error::invalid(std::string(name) + ": " + what +
                              " given but dtype=" + std::string(baracuda::name(p.desc.dtype)) +
                              ": descales belong to e4m3 inputs");
      continue;
    }
    const int64_t one[] = {1};
    BARACUDA_TRY(validate::tensor(name, what, t, DType::f32, one, where));
    BARACUDA_TRY(validate::no_overlap(name, "y", a.y, what, t));
    BARACUDA_TRY(validate::no_overlap(name, "lse", a.lse, what, t));
  }
  for (auto [what, in] : {std::pair{"q", a.q}, {"k", a.k}, {"v", a.v}}) {
    BARACUDA_TRY(validate::no_overlap(name, "y", a.y, what, in));
    BARACUDA_TRY(validate::no_overlap(name, "lse", a.lse, what, in));
  }
  return validate::no_overlap(name, "lse", a.lse, "y", as_const(a.y));
}

Status BackwardOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const Shapes s = shapes_of(p);
  const int r = s.rank_qkv;
  BARACUDA_TRY(qkv_tensor(name, "q", a.q, p, s.q, r, where, true));
  BARACUDA_TRY(qkv_tensor(name, "k", a.k, p, s.k, s.rank_kv, where, true));
  BARACUDA_TRY(qkv_tensor(name, "v", a.v, p, s.v, s.rank_kv, where, true));
  BARACUDA_TRY(qkv_tensor(name, "y", a.y, p, s.y, r, where, true));
  BARACUDA_TRY(qkv_tensor(name, "dy", a.dy, p, s.y, r, where, true));
  BARACUDA_TRY(validate::tensor(name, "lse", a.lse, p.lse_dtype,
                                std::span<const int64_t>(s.lse, s.rank_lse), where,
                                {.allow_broadcast = true}));
  BARACUDA_TRY(qkv_tensor(name, "dq", a.dq, p, s.q, r, where, false));
  BARACUDA_TRY(qkv_tensor(name, "dk", a.dk, p, s.k, r, where, false));
  BARACUDA_TRY(qkv_tensor(name, "dv", a.dv, p, s.v, r, where, false));
  BARACUDA_TRY(seqlens(name, p, a.cu_seqlens_q, a.cu_seqlens_k, where));
  const std::pair<const char*, ConstTensor> ins[] = {{"q", a.q}, {"k", a.k},   {"v", a.v},
                                                     {"y", a.y}, {"dy", a.dy}, {"lse", a.lse}};
  const std::pair<const char*, Tensor> outs[] = {{"dq", a.dq}, {"dk", a.dk}, {"dv", a.dv}};
  for (const auto& [on, out] : outs)
    for (const auto& [in_name, in] : ins)
      BARACUDA_TRY(validate::no_overlap(name, on, out, in_name, in));
  BARACUDA_TRY(validate::no_overlap(name, "dq", a.dq, "dk", as_const(a.dk)));
  BARACUDA_TRY(validate::no_overlap(name, "dq", a.dq, "dv", as_const(a.dv)));
  return validate::no_overlap(name, "dk", a.dk, "dv", as_const(a.dv));
}

}  // namespace baracuda::attention

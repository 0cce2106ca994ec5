// Descriptor and argument validation for the ssd ops. Every rule returns an Error naming the op,
// the argument and the numbers; nothing here launches or writes.
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "baracuda/core/validate.hpp"
#include "baracuda/ops/ssd.hpp"

namespace baracuda {
namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}
std::string num(float v) {
  return std::to_string(v);
}

Error invalid(std::string_view op, const std::string& what) {
  return Error::invalid(std::string(op) + ": " + what);
}

bool is_supported_element(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

// Rules shared by the prefill and decode descriptors.
Status check_common(std::string_view op, int64_t heads, int64_t head_dim, int64_t state_dim,
                    int64_t ngroups, DType dtype, float dt_min, float dt_max) {
  if (!is_supported_element(dtype))
    return Error::unsupported(std::string(op) + ": dtype=" + std::string(name(dtype)) +
                              ": element must be f32, f16 or bf16");
  if (ngroups < 1) return invalid(op, "ngroups=" + num(ngroups) + ": must be >= 1");
  if (heads % ngroups != 0)
    return invalid(op, "heads=" + num(heads) + ": not a multiple of ngroups=" + num(ngroups));
  if (head_dim < 1 || head_dim > 256)
    return invalid(op, "head_dim=" + num(head_dim) + ": must be in [1, 256]");
  if (state_dim < 1 || state_dim > 256)
    return invalid(op, "state_dim=" + num(state_dim) + ": must be in [1, 256]");
  if (std::isnan(dt_min) || std::isnan(dt_max) || dt_min < 0.0f || dt_min > dt_max)
    return invalid(
        op, "dt clamp (" + num(dt_min) + ", " + num(dt_max) + "): need 0 <= dt_min <= dt_max");
  return {};
}

// An optional argument: validated when the descriptor enables it, must be absent otherwise.
template <class Ptr>
Status optional_tensor(std::string_view op, std::string_view arg, bool enabled,
                       std::string_view flag, const BasicTensor<Ptr>& t, DType dtype,
                       std::span<const int64_t> dims, Location where, bool input) {
  if (!enabled) {
    if (t.data != nullptr)
      return invalid(
          op, std::string(arg) + ": given but the descriptor's " + std::string(flag) + " is off");
    return {};
  }
  if (t.data == nullptr && t.rank == 0)  // a default-constructed view: the caller forgot it
    return invalid(
        op, std::string(arg) + ": missing, but the descriptor's " + std::string(flag) + " is on");
  return validate::tensor(op, arg, t, dtype, dims, where, {.allow_broadcast = input});
}

Status check_cu_seqlens(std::string_view op, const ssd::Problem& p, const ConstTensor& cu,
                        Location where) {
  if (!p.varlen()) {
    if (cu.data != nullptr) return invalid(op, "cu_seqlens: given but num_seqs is 0");
    return {};
  }
  if (cu.data == nullptr && cu.rank == 0)
    return invalid(op, "cu_seqlens: missing, but num_seqs=" + num(p.num_seqs) + " > 0");
  const int64_t dims[] = {p.num_seqs + 1};
  BARACUDA_TRY(validate::tensor(op, "cu_seqlens", cu, DType::i32, dims, where));
  if (!where.is_host()) return {};  // device contents: the caller's contract (kernels clamp)
  const auto* v = static_cast<const int32_t*>(cu.data);
  auto at = [&](int64_t i) { return static_cast<int64_t>(v[i * cu.stride[0]]); };
  if (at(0) != 0) return invalid(op, "cu_seqlens[0]=" + num(at(0)) + ": must be 0");
  for (int64_t i = 1; i <= p.num_seqs; ++i)
    if (at(i) < at(i - 1))
      return invalid(op, "cu_seqlens[" + num(i) + "]=" + num(at(i)) + " < cu_seqlens[" +
                             num(i - 1) + "]=" + num(at(i - 1)) + ": must be non-decreasing");
  if (at(p.num_seqs) != p.seqlen)
    return invalid(op, "cu_seqlens[" + num(p.num_seqs) + "]=" + num(at(p.num_seqs)) +
                           ": must equal seqlen=" + num(p.seqlen));
  return {};
}

struct Dims {
  int64_t x[4], dt[3], bc[4], a[1], d_head[1], d_chan[2], states[4];
  std::span<const int64_t> d(ssd::DSkip k) const {
    return k == ssd::DSkip::per_channel ? std::span<const int64_t>(d_chan)
                                        : std::span<const int64_t>(d_head);
  }
};
Dims dims_of(const ssd::Problem& p) {
  return {{p.batch, p.seqlen, p.heads, p.head_dim},
          {p.batch, p.seqlen, p.heads},
          {p.batch, p.seqlen, p.ngroups, p.state_dim},
          {p.heads},
          {p.heads},
          {p.heads, p.head_dim},
          {p.seqs, p.heads, p.head_dim, p.state_dim}};
}

// The inputs the forward and the backward share.
template <class Args>
Status check_forward_inputs(std::string_view op, const ssd::Problem& p, const Args& a,
                            Location where) {
  const Dims d = dims_of(p);
  const validate::TensorRule in{.allow_broadcast = true};
  BARACUDA_TRY(validate::tensor(op, "x", a.x, p.dtype, d.x, where, in));
  BARACUDA_TRY(validate::tensor(op, "dt", a.dt, p.dtype, d.dt, where, in));
  BARACUDA_TRY(validate::tensor(op, "A", a.A, DType::f32, d.a, where, in));
  BARACUDA_TRY(validate::tensor(op, "B", a.B, p.dtype, d.bc, where, in));
  BARACUDA_TRY(validate::tensor(op, "C", a.C, p.dtype, d.bc, where, in));
  BARACUDA_TRY(optional_tensor(op, "D", p.d_skip != ssd::DSkip::none, "d_skip", a.D, DType::f32,
                               d.d(p.d_skip), where, true));
  BARACUDA_TRY(optional_tensor(op, "z", p.has_z, "has_z", a.z, p.dtype, d.x, where, true));
  BARACUDA_TRY(optional_tensor(op, "dt_bias", p.has_dt_bias, "has_dt_bias", a.dt_bias, DType::f32,
                               d.a, where, true));
  BARACUDA_TRY(optional_tensor(op, "initial_states", p.has_initial_states, "has_initial_states",
                               a.initial_states, DType::f32, d.states, where, true));
  return check_cu_seqlens(op, p, a.cu_seqlens, where);
}

// An output must not alias any input (the kernels read inputs after writing outputs).
template <class Args>
Status no_overlap_inputs(std::string_view op, std::string_view out_arg, const Tensor& out,
                         const Args& a) {
  if (out.data == nullptr) return {};
  const std::pair<std::string_view, const ConstTensor*> ins[] = {
      {"x", &a.x},
      {"dt", &a.dt},
      {"A", &a.A},
      {"B", &a.B},
      {"C", &a.C},
      {"D", &a.D},
      {"z", &a.z},
      {"dt_bias", &a.dt_bias},
      {"initial_states", &a.initial_states},
      {"cu_seqlens", &a.cu_seqlens}};
  for (const auto& [n, t] : ins)
    if (t->data != nullptr) BARACUDA_TRY(validate::no_overlap(op, out_arg, out, n, *t));
  return {};
}

}  // namespace

namespace ssd {

namespace {
std::atomic<StageSink*> g_stage_sink{nullptr};
}  // namespace
void set_stage_sink(StageSink* sink) {
  g_stage_sink.store(sink, std::memory_order_release);
}
StageSink* stage_sink() {
  return g_stage_sink.load(std::memory_order_acquire);
}

Result<Problem> make_problem(std::string_view op, const Descriptor& d) {
  const int64_t shape[] = {d.batch, d.seqlen, d.heads, d.head_dim, d.state_dim};
  BARACUDA_TRY(
      validate::shape(op, "descriptor [batch, seqlen, heads, head_dim, state_dim]", shape));
  BARACUDA_TRY(
      check_common(op, d.heads, d.head_dim, d.state_dim, d.ngroups, d.dtype, d.dt_min, d.dt_max));
  if (d.chunk_size != 64 && d.chunk_size != 128 && d.chunk_size != 256)
    return invalid(op, "chunk_size=" + num(d.chunk_size) + ": must be 64, 128 or 256");
  if (d.num_seqs < 0) return invalid(op, "num_seqs=" + num(d.num_seqs) + ": is negative");
  if (d.num_seqs > 0 && d.batch != 1)
    return invalid(
        op, "num_seqs=" + num(d.num_seqs) + ": varlen needs batch=1, got batch=" + num(d.batch));
  // Every tensor's element count must fit in int64 (the largest is the states or x/B/C).
  Problem p;
  static_cast<Descriptor&>(p) = d;
  p.seqs = d.num_seqs > 0 ? d.num_seqs : d.batch;
  const int64_t states[] = {p.seqs, d.heads, d.head_dim, d.state_dim};
  BARACUDA_TRY(validate::shape(op, "states [seqs, heads, head_dim, state_dim]", states));
  const int64_t bc[] = {d.batch, d.seqlen, d.ngroups, d.state_dim};
  BARACUDA_TRY(validate::shape(op, "B/C [batch, seqlen, ngroups, state_dim]", bc));
  if (d.seqlen >= (int64_t{1} << 31))
    return invalid(op, "seqlen=" + num(d.seqlen) + ": must be < 2^31 (cu_seqlens is i32)");
  p.heads_per_group = d.heads / d.ngroups;
  p.nchunks = (d.seqlen + d.chunk_size - 1) / d.chunk_size;
  return p;
}

}  // namespace ssd

Status SsdForwardOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const Dims d = dims_of(p);
  BARACUDA_TRY(check_forward_inputs(name, p, a, where));
  BARACUDA_TRY(validate::tensor(name, "y", a.y, p.dtype, d.x, where));
  BARACUDA_TRY(optional_tensor(name, "final_states", p.has_final_states, "has_final_states",
                               a.final_states, DType::f32, d.states, where, false));
  BARACUDA_TRY(no_overlap_inputs(name, "y", a.y, a));
  BARACUDA_TRY(no_overlap_inputs(name, "final_states", a.final_states, a));
  if (a.final_states.data != nullptr)
    BARACUDA_TRY(validate::no_overlap(name, "final_states", a.final_states, "y", as_const(a.y)));
  return {};
}

Status SsdBackwardOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const Dims d = dims_of(p);
  const validate::TensorRule in{.allow_broadcast = true};
  BARACUDA_TRY(check_forward_inputs(name, p, a, where));
  BARACUDA_TRY(validate::tensor(name, "dy", a.dy, p.dtype, d.x, where, in));
  BARACUDA_TRY(optional_tensor(name, "d_final_states", p.has_final_states, "has_final_states",
                               a.d_final_states, DType::f32, d.states, where, true));
  BARACUDA_TRY(validate::tensor(name, "dx", a.dx, p.dtype, d.x, where));
  BARACUDA_TRY(validate::tensor(name, "ddt", a.ddt, p.dtype, d.dt, where));
  BARACUDA_TRY(validate::tensor(name, "dA", a.dA, DType::f32, d.a, where));
  BARACUDA_TRY(validate::tensor(name, "dB", a.dB, p.dtype, d.bc, where));
  BARACUDA_TRY(validate::tensor(name, "dC", a.dC, p.dtype, d.bc, where));
  BARACUDA_TRY(optional_tensor(name, "dD", p.d_skip != ssd::DSkip::none, "d_skip", a.dD, DType::f32,
                               d.d(p.d_skip), where, false));
  BARACUDA_TRY(optional_tensor(name, "dz", p.has_z, "has_z", a.dz, p.dtype, d.x, where, false));
  BARACUDA_TRY(optional_tensor(name, "ddt_bias", p.has_dt_bias, "has_dt_bias", a.ddt_bias,
                               DType::f32, d.a, where, false));
  BARACUDA_TRY(optional_tensor(name, "d_initial_states", p.has_initial_states, "has_initial_states",
                               a.d_initial_states, DType::f32, d.states, where, false));
  // Outputs: disjoint from every input and from each other.
  const std::pair<std::string_view, const Tensor*> outs[] = {
      {"dx", &a.dx},
      {"ddt", &a.ddt},
      {"dA", &a.dA},
      {"dB", &a.dB},
      {"dC", &a.dC},
      {"dD", &a.dD},
      {"dz", &a.dz},
      {"ddt_bias", &a.ddt_bias},
      {"d_initial_states", &a.d_initial_states}};
  for (size_t i = 0; i < std::size(outs); ++i) {
    const auto& [n, t] = outs[i];
    if (t->data == nullptr) continue;
    BARACUDA_TRY(no_overlap_inputs(name, n, *t, a));
    BARACUDA_TRY(validate::no_overlap(name, n, *t, "dy", a.dy));
    if (a.d_final_states.data != nullptr)
      BARACUDA_TRY(validate::no_overlap(name, n, *t, "d_final_states", a.d_final_states));
    for (size_t j = 0; j < i; ++j)
      if (outs[j].second->data != nullptr)
        BARACUDA_TRY(validate::no_overlap(name, n, *t, outs[j].first, as_const(*outs[j].second)));
  }
  return {};
}

Result<ssd::DecodeProblem> SsdDecodeOp::make_problem(const Descriptor& d) {
  const int64_t shape[] = {d.batch, d.heads, d.head_dim, d.state_dim};
  BARACUDA_TRY(validate::shape(name, "descriptor [batch, heads, head_dim, state_dim]", shape));
  BARACUDA_TRY(
      check_common(name, d.heads, d.head_dim, d.state_dim, d.ngroups, d.dtype, d.dt_min, d.dt_max));
  ssd::DecodeProblem p;
  static_cast<ssd::DecodeDescriptor&>(p) = d;
  p.heads_per_group = d.heads / d.ngroups;
  return p;
}

Status SsdDecodeOp::check_arguments(const Problem& p, const Arguments& a, Location where) {
  const validate::TensorRule in{.allow_broadcast = true};
  const int64_t state[] = {p.batch, p.heads, p.head_dim, p.state_dim};
  const int64_t x[] = {p.batch, p.heads, p.head_dim};
  const int64_t dt[] = {p.batch, p.heads};
  const int64_t bc[] = {p.batch, p.ngroups, p.state_dim};
  const int64_t h[] = {p.heads};
  const int64_t hd[] = {p.heads, p.head_dim};
  BARACUDA_TRY(validate::tensor(name, "state", a.state, DType::f32, state, where));
  BARACUDA_TRY(validate::tensor(name, "x", a.x, p.dtype, x, where, in));
  BARACUDA_TRY(validate::tensor(name, "dt", a.dt, p.dtype, dt, where, in));
  BARACUDA_TRY(validate::tensor(name, "A", a.A, DType::f32, h, where, in));
  BARACUDA_TRY(validate::tensor(name, "B", a.B, p.dtype, bc, where, in));
  BARACUDA_TRY(validate::tensor(name, "C", a.C, p.dtype, bc, where, in));
  const bool per_channel = p.d_skip == ssd::DSkip::per_channel;
  BARACUDA_TRY(optional_tensor(
      name, "D", p.d_skip != ssd::DSkip::none, "d_skip", a.D, DType::f32,
      per_channel ? std::span<const int64_t>(hd) : std::span<const int64_t>(h), where, true));
  BARACUDA_TRY(optional_tensor(name, "z", p.has_z, "has_z", a.z, p.dtype, x, where, true));
  BARACUDA_TRY(optional_tensor(name, "dt_bias", p.has_dt_bias, "has_dt_bias", a.dt_bias, DType::f32,
                               h, where, true));
  BARACUDA_TRY(validate::tensor(name, "y", a.y, p.dtype, x, where));
  BARACUDA_TRY(validate::no_overlap(name, "y", a.y, "state", as_const(a.state)));
  const std::pair<std::string_view, const ConstTensor*> ins[] = {
      {"x", &a.x}, {"dt", &a.dt}, {"A", &a.A}, {"B", &a.B},
      {"C", &a.C}, {"D", &a.D},   {"z", &a.z}, {"dt_bias", &a.dt_bias}};
  for (const auto& [n, t] : ins) {
    if (t->data == nullptr) continue;
    BARACUDA_TRY(validate::no_overlap(name, "y", a.y, n, *t));
    BARACUDA_TRY(validate::no_overlap(name, "state", a.state, n, *t));
  }
  return {};
}

}  // namespace baracuda

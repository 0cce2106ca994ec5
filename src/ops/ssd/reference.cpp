// The CPU backend of the ssd ops: the float64 sequential recurrence and its exact adjoint. It is
// the test oracle, so it is written for clarity, never for speed: one (sequence, head) at a time,
// the state as a dense [D, N] matrix, the backward keeping every state of the sequence.
#include "ops/ssd/reference.hpp"

#include <algorithm>
#include <cmath>

#include "baracuda/core/plan.hpp"

namespace baracuda::ssd::ref {
namespace {

struct Range {
  int64_t b, t0, t1;
};
Range seq_range(const Problem& p, const Inputs& in, int64_t s) {
  if (!p.varlen()) return {s, 0, p.seqlen};
  // Clamped like the GPU kernels clamp: the host path has validated cu already.
  const int64_t t0 = std::clamp<int64_t>(in.cu[static_cast<size_t>(s)], 0, p.seqlen);
  const int64_t t1 = std::clamp<int64_t>(in.cu[static_cast<size_t>(s + 1)], t0, p.seqlen);
  return {0, t0, t1};
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

// Index helpers for the dense layouts.
struct Index {
  const Problem& p;
  size_t x(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * p.seqlen + t) * p.heads + h) * p.head_dim + d);
  }
  size_t dt(int64_t b, int64_t t, int64_t h) const {
    return static_cast<size_t>((b * p.seqlen + t) * p.heads + h);
  }
  size_t bc(int64_t b, int64_t t, int64_t g, int64_t n) const {
    return static_cast<size_t>(((b * p.seqlen + t) * p.ngroups + g) * p.state_dim + n);
  }
  size_t st(int64_t s, int64_t h) const {
    return static_cast<size_t>((s * p.heads + h) * p.head_dim * p.state_dim);
  }
  size_t dskip(int64_t h, int64_t d) const {
    return static_cast<size_t>(p.d_skip == DSkip::per_channel ? h * p.head_dim + d : h);
  }
};

double skip_of(const Problem& p, const Inputs& in, const Index& ix, int64_t h, int64_t d) {
  return p.d_skip == DSkip::none ? 0.0 : in.D[ix.dskip(h, d)];
}

Step step_of(const Problem& p, const Inputs& in, const Index& ix, int64_t b, int64_t t, int64_t h) {
  const double raw =
      in.dt[ix.dt(b, t, h)] + (p.has_dt_bias ? in.dt_bias[static_cast<size_t>(h)] : 0.0);
  return process_dt(raw, p.dt_softplus, p.dt_min, p.dt_max);
}

// Advances the [D, N] state by one token: state = a * state + v * x (outer) B.
void advance(std::vector<double>& state, const Problem& p, const Inputs& in, const Index& ix,
             int64_t b, int64_t t, int64_t h, double a, double v) {
  const int64_t g = h / p.heads_per_group, N = p.state_dim;
  for (int64_t d = 0; d < p.head_dim; ++d) {
    const double xv = in.x[ix.x(b, t, h, d)];
    for (int64_t n = 0; n < N; ++n) {
      double& s = state[static_cast<size_t>(d * N + n)];
      s = a * s + v * xv * in.B[ix.bc(b, t, g, n)];
    }
  }
}

}  // namespace

Step process_dt(double raw, bool softplus, double dt_min, double dt_max) {
  double v = raw, dv = 1.0;
  if (softplus) {
    v = raw > 0 ? raw + std::log1p(std::exp(-raw)) : std::log1p(std::exp(raw));
    dv = sigmoid(raw);
  }
  if (v < dt_min) v = dt_min, dv = 0.0;
  if (v > dt_max) v = dt_max, dv = 0.0;
  return {v, dv};
}

Outputs forward(const Problem& p, const Inputs& in) {
  const Index ix{p};
  const int64_t D = p.head_dim, N = p.state_dim;
  Outputs out;
  out.y.assign(static_cast<size_t>(p.batch * p.seqlen * p.heads * D), 0.0);
  out.final_states.assign(static_cast<size_t>(p.seqs * p.heads * D * N), 0.0);
  std::vector<double> state(static_cast<size_t>(D * N));
  for (int64_t s = 0; s < p.seqs; ++s) {
    const Range r = seq_range(p, in, s);
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t g = h / p.heads_per_group;
      if (p.has_initial_states)
        std::copy_n(in.init.begin() + static_cast<ptrdiff_t>(ix.st(s, h)), D * N, state.begin());
      else
        std::fill(state.begin(), state.end(), 0.0);
      for (int64_t t = r.t0; t < r.t1; ++t) {
        const Step sp = step_of(p, in, ix, r.b, t, h);
        advance(state, p, in, ix, r.b, t, h, std::exp(sp.v * in.A[static_cast<size_t>(h)]), sp.v);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t n = 0; n < N; ++n)
            acc += in.C[ix.bc(r.b, t, g, n)] * state[static_cast<size_t>(d * N + n)];
          const size_t xi = ix.x(r.b, t, h, d);
          double y = acc + skip_of(p, in, ix, h, d) * in.x[xi];
          if (p.has_z) y *= in.z[xi] * sigmoid(in.z[xi]);
          out.y[xi] = y;
        }
      }
      std::copy(state.begin(), state.end(),
                out.final_states.begin() + static_cast<ptrdiff_t>(ix.st(s, h)));
    }
  }
  return out;
}

Grads backward(const Problem& p, const Inputs& in, const std::vector<double>& dy,
               const std::vector<double>& d_final) {
  const Index ix{p};
  const int64_t D = p.head_dim, N = p.state_dim, DN = D * N;
  Grads gr;
  gr.dx.assign(in.x.size(), 0.0);
  gr.ddt.assign(in.dt.size(), 0.0);
  gr.dA.assign(static_cast<size_t>(p.heads), 0.0);
  gr.dB.assign(in.B.size(), 0.0);
  gr.dC.assign(in.C.size(), 0.0);
  gr.dD.assign(in.D.size(), 0.0);
  gr.dz.assign(in.z.size(), 0.0);
  gr.ddt_bias.assign(p.has_dt_bias ? static_cast<size_t>(p.heads) : 0, 0.0);
  gr.dA_terms.assign(gr.dA.size(), 0.0);
  gr.dD_terms.assign(gr.dD.size(), 0.0);
  gr.ddt_bias_terms.assign(gr.ddt_bias.size(), 0.0);
  gr.d_init.assign(p.has_initial_states ? static_cast<size_t>(p.seqs * p.heads * DN) : 0, 0.0);
  std::vector<double> g(static_cast<size_t>(DN)), dyp(static_cast<size_t>(D));
  for (int64_t s = 0; s < p.seqs; ++s) {
    const Range r = seq_range(p, in, s);
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t grp = h / p.heads_per_group;
      const double A = in.A[static_cast<size_t>(h)];
      // hist[k] is the state before token t0 + k (hist[len] the final state).
      const int64_t len = r.t1 - r.t0;
      std::vector<double> hist(static_cast<size_t>((len + 1) * DN), 0.0);
      if (p.has_initial_states)
        std::copy_n(in.init.begin() + static_cast<ptrdiff_t>(ix.st(s, h)), DN, hist.begin());
      for (int64_t k = 0; k < len; ++k) {
        std::vector<double> st(hist.begin() + k * DN, hist.begin() + (k + 1) * DN);
        const Step sp = step_of(p, in, ix, r.b, r.t0 + k, h);
        advance(st, p, in, ix, r.b, r.t0 + k, h, std::exp(sp.v * A), sp.v);
        std::copy(st.begin(), st.end(), hist.begin() + (k + 1) * DN);
      }
      if (!d_final.empty())
        std::copy_n(d_final.begin() + static_cast<ptrdiff_t>(ix.st(s, h)), DN, g.begin());
      else
        std::fill(g.begin(), g.end(), 0.0);
      for (int64_t k = len - 1; k >= 0; --k) {
        const int64_t t = r.t0 + k;
        const Step sp = step_of(p, in, ix, r.b, t, h);
        const double a = std::exp(sp.v * A);
        const double* hprev = hist.data() + k * DN;
        const double* hcur = hist.data() + (k + 1) * DN;
        // Output side: y = (C . h + Dskip x) * silu(z).
        for (int64_t d = 0; d < D; ++d) {
          const size_t xi = ix.x(r.b, t, h, d);
          double ssm = 0;
          for (int64_t n = 0; n < N; ++n) ssm += in.C[ix.bc(r.b, t, grp, n)] * hcur[d * N + n];
          const double dsk = skip_of(p, in, ix, h, d);
          const double ypre = ssm + dsk * in.x[xi];
          double dyv = dy[xi];
          if (p.has_z) {
            const double z = in.z[xi], sg = sigmoid(z);
            gr.dz[xi] = dyv * ypre * sg * (1.0 + z * (1.0 - sg));
            dyv *= z * sg;
          }
          dyp[static_cast<size_t>(d)] = dyv;
          if (p.d_skip != DSkip::none) {
            gr.dD[ix.dskip(h, d)] += dyv * in.x[xi];
            gr.dD_terms[ix.dskip(h, d)] += std::fabs(dyv * in.x[xi]);
          }
          gr.dx[xi] = dyv * dsk;
          for (int64_t n = 0; n < N; ++n) {
            gr.dC[ix.bc(r.b, t, grp, n)] += dyv * hcur[d * N + n];
            g[static_cast<size_t>(d * N + n)] += dyv * in.C[ix.bc(r.b, t, grp, n)];
          }
        }
        // g is now the full adjoint of the state after token t.
        double dv = 0, q = 0, dv_terms = 0, q_terms = 0;
        for (int64_t d = 0; d < D; ++d) {
          const size_t xi = ix.x(r.b, t, h, d);
          double u = 0, u_terms = 0;
          for (int64_t n = 0; n < N; ++n) {
            const double gv = g[static_cast<size_t>(d * N + n)];
            u += gv * in.B[ix.bc(r.b, t, grp, n)];
            u_terms += std::fabs(gv * in.B[ix.bc(r.b, t, grp, n)]);
            gr.dB[ix.bc(r.b, t, grp, n)] += sp.v * gv * in.x[xi];
            q += gv * hprev[d * N + n];
            q_terms += std::fabs(gv * hprev[d * N + n]);
          }
          gr.dx[xi] += sp.v * u;
          dv += in.x[xi] * u;
          dv_terms += std::fabs(in.x[xi]) * u_terms;
        }
        const double dl = a * q;  // d/d(v*A) of state = a * state_prev + ...
        dv += dl * A;
        dv_terms += a * q_terms * std::fabs(A);
        gr.dA[static_cast<size_t>(h)] += dl * sp.v;
        gr.dA_terms[static_cast<size_t>(h)] += a * q_terms * std::fabs(sp.v);
        const double draw = dv * sp.dv_draw;
        gr.ddt[ix.dt(r.b, t, h)] = draw;
        if (p.has_dt_bias) {
          gr.ddt_bias[static_cast<size_t>(h)] += draw;
          gr.ddt_bias_terms[static_cast<size_t>(h)] += dv_terms * std::fabs(sp.dv_draw);
        }
        for (double& gv : g) gv *= a;
      }
      if (p.has_initial_states)
        std::copy(g.begin(), g.end(), gr.d_init.begin() + static_cast<ptrdiff_t>(ix.st(s, h)));
    }
  }
  return gr;
}

void decode(const DecodeProblem& p, std::vector<double>& state, const Inputs& in,
            std::vector<double>& y) {
  const int64_t D = p.head_dim, N = p.state_dim;
  y.assign(static_cast<size_t>(p.batch * p.heads * D), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t g = h / p.heads_per_group;
      const double raw = in.dt[static_cast<size_t>(b * p.heads + h)] +
                         (p.has_dt_bias ? in.dt_bias[static_cast<size_t>(h)] : 0.0);
      const Step sp = process_dt(raw, p.dt_softplus, p.dt_min, p.dt_max);
      const double a = std::exp(sp.v * in.A[static_cast<size_t>(h)]);
      for (int64_t d = 0; d < D; ++d) {
        const size_t xi = static_cast<size_t>((b * p.heads + h) * D + d);
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) {
          const size_t bi = static_cast<size_t>((b * p.ngroups + g) * N + n);
          double& s = state[xi * static_cast<size_t>(N) + static_cast<size_t>(n)];
          s = a * s + sp.v * in.x[xi] * in.B[bi];
          acc += in.C[bi] * s;
        }
        const double dsk = p.d_skip == DSkip::none       ? 0.0
                           : p.d_skip == DSkip::per_head ? in.D[static_cast<size_t>(h)]
                                                         : in.D[static_cast<size_t>(h * D + d)];
        double v = acc + dsk * in.x[xi];
        if (p.has_z) v *= in.z[xi] / (1.0 + std::exp(-in.z[xi]));
        y[xi] = v;
      }
    }
}

}  // namespace baracuda::ssd::ref

// ---- the CPU backend: gather strided tensors, run the reference, scatter the results -----------
namespace baracuda {
namespace {

template <class Ptr>
void for_each_offset(const BasicTensor<Ptr>& t, const auto& fn) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (int d = t.rank - 1; d >= 0; --d) {
      off += (rem % t.shape[d]) * t.stride[d];
      rem /= t.shape[d];
    }
    fn(off);
  }
}

std::vector<double> gather(const ConstTensor& t) {
  std::vector<double> v;
  if (t.data == nullptr) return v;
  v.reserve(static_cast<size_t>(t.numel()));
  for_each_offset(t, [&](int64_t off) { v.push_back(load_as_double(t.data, t.dtype, off)); });
  return v;
}

void scatter(const Tensor& t, const std::vector<double>& v) {
  if (t.data == nullptr) return;
  size_t i = 0;
  for_each_offset(t, [&](int64_t off) { store_from_double(t.data, t.dtype, off, v[i++]); });
}

template <class Args>
ssd::ref::Inputs gather_inputs(const Args& a) {
  ssd::ref::Inputs in{gather(a.x), gather(a.dt),      gather(a.A),
                      gather(a.B), gather(a.C),       gather(a.D),
                      gather(a.z), gather(a.dt_bias), gather(a.initial_states),
                      {}};
  if (a.cu_seqlens.data != nullptr)
    for (double c : gather(a.cu_seqlens)) in.cu.push_back(static_cast<int64_t>(c));
  return in;
}

Status forward_cpu(const LaunchContext&, const ssd::Problem& p, const SsdForwardOp::Arguments& a) {
  const ssd::ref::Outputs out = ssd::ref::forward(p, gather_inputs(a));
  scatter(a.y, out.y);
  scatter(a.final_states, out.final_states);
  return {};
}

Status backward_cpu(const LaunchContext&, const ssd::Problem& p,
                    const SsdBackwardOp::Arguments& a) {
  const ssd::ref::Grads g =
      ssd::ref::backward(p, gather_inputs(a), gather(a.dy), gather(a.d_final_states));
  scatter(a.dx, g.dx);
  scatter(a.ddt, g.ddt);
  scatter(a.dA, g.dA);
  scatter(a.dB, g.dB);
  scatter(a.dC, g.dC);
  scatter(a.dD, g.dD);
  scatter(a.dz, g.dz);
  scatter(a.ddt_bias, g.ddt_bias);
  scatter(a.d_initial_states, g.d_init);
  return {};
}

Status decode_cpu(const LaunchContext&, const ssd::DecodeProblem& p,
                  const SsdDecodeOp::Arguments& a) {
  ssd::ref::Inputs in{gather(a.x), gather(a.dt), gather(a.A),       gather(a.B), gather(a.C),
                      gather(a.D), gather(a.z),  gather(a.dt_bias), {},          {}};
  std::vector<double> state = gather(as_const(a.state)), y;
  ssd::ref::decode(p, state, in, y);
  scatter(a.state, state);
  scatter(a.y, y);
  return {};
}

constexpr PrecisionGuarantee kReference{MathPrecision::f64, DType::f64, true, true};

bool register_all() {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    register_kernel<SsdForwardOp>({.sku = {.category = "scan",
                                           .op = "ssd_forward",
                                           .element = t,
                                           .precision = kReference,
                                           .name = "reference"},
                                   .launch = forward_cpu});
    register_kernel<SsdBackwardOp>({.sku = {.category = "scan",
                                            .op = "ssd_backward",
                                            .element = t,
                                            .precision = kReference,
                                            .name = "reference"},
                                    .launch = backward_cpu});
    register_kernel<SsdDecodeOp>({.sku = {.category = "scan",
                                          .op = "ssd_decode",
                                          .element = t,
                                          .precision = kReference,
                                          .name = "reference"},
                                  .launch = decode_cpu});
  }
  return true;
}
BARACUDA_REGISTER(register_all());

}  // namespace
}  // namespace baracuda

// The float64 reference of the ssd ops on dense row-major vectors: the sequential recurrence
// (forward), its exact adjoint (backward) and one decode step. The CPU backend gathers strided
// tensors into these layouts and calls them; the tests call them directly as the oracle and for
// finite differences.
#pragma once

#include <cstdint>
#include <vector>

#include "baracuda/ops/ssd.hpp"

namespace baracuda::ssd::ref {

// Dense layouts: x, z [B, L, H, D]; dt [B, L, H]; B, C [B, L, G, N]; A, dt_bias [H];
// D [H] or [H, D]; states [S, H, D, N]; cu [S + 1] (varlen only). Unused inputs may be empty.
struct Inputs {
  std::vector<double> x, dt, A, B, C, D, z, dt_bias, init;
  std::vector<int64_t> cu;
};
struct Outputs {
  std::vector<double> y, final_states;
};
struct Grads {
  std::vector<double> dx, ddt, dA, dB, dC, dD, dz, ddt_bias, d_init;
  // Sum of |product| over every product that formed dA, dD, ddt_bias: these sum signed terms over a
  // whole sequence, and the tests bound their error by it (testing::close_to_terms).
  std::vector<double> dA_terms, dD_terms, ddt_bias_terms;
};

// The processed step v = clamp(softplus?(dt + bias)) and dv/d(dt) (0 where the clamp binds).
struct Step {
  double v, dv_draw;
};
Step process_dt(double raw, bool softplus, double dt_min, double dt_max);

Outputs forward(const Problem& p, const Inputs& in);
// dy [B, L, H, D]; d_final [S, H, D, N] (empty: zero).
Grads backward(const Problem& p, const Inputs& in, const std::vector<double>& dy,
               const std::vector<double>& d_final);

// Decode layouts: state [B, H, D, N] (updated in place), x, z, y [B, H, D], dt [B, H],
// B, C [B, G, N].
void decode(const DecodeProblem& p, std::vector<double>& state, const Inputs& in,
            std::vector<double>& y);

}  // namespace baracuda::ssd::ref

// Mamba-2 SSD (state-space duality) selective scan: forward (chunked prefill), backward, and the
// one-token decode step.
//
// Per head h (scalar A_h), group g = h / (H / G), with the processed step
//   v[t] = clamp(softplus?(dt[t] + dt_bias_h), dt_min, dt_max)
// the recurrence is
//   state[t] = exp(v[t] * A_h) * state[t-1] + v[t] * x[t] (outer) B[t, g]      state: [D, N]
//   y[t]     = (state[t] . C[t, g] + D_h * x[t]) * silu(z[t])                   y: [D]
// with every term after the first optional. Sequences are the B rows of length L, or (varlen)
// `num_seqs` packed segments [cu_seqlens[s], cu_seqlens[s+1]) of one row (batch must be 1); the
// state starts at initial_states[s] (or zero) at each sequence start and final_states[s] receives
// the state after its last token.
//
// Tensors (all strided views; `S` = number of sequences = batch or num_seqs):
//   x, y, z, dx, dz      [B, L, H, D]  element dtype
//   dt, ddt              [B, L, H]     element dtype
//   B, C, dB, dC         [B, L, G, N]  element dtype
//   A, dA, dt_bias, ddt_bias  [H]      f32 (model parameters)
//   D, dD                [H] or [H, D] f32
//   initial_states, final_states, d_final_states, d_initial_states  [S, H, D, N]  f32
//   cu_seqlens           [num_seqs + 1] i32, 0 = cu[0] <= cu[1] <= ... <= cu[S] = L
// The element dtype is f32, f16 or bf16. On a CPU stream cu_seqlens is checked element by
// element; a GPU plan cannot read it without synchronizing, so there its contents are the
// caller's contract (out-of-range values are clamped into [0, L], never dereferenced).
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "baracuda/core/plan.hpp"

namespace baracuda {
namespace ssd {

enum class DSkip : uint8_t { none, per_head, per_channel };

// Shared by the forward and backward ops (the backward replays the forward's configuration).
struct Descriptor {
  int64_t batch = 0;
  int64_t seqlen = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;      // D, at most 256
  int64_t state_dim = 0;     // N, at most 256
  int64_t ngroups = 1;       // G, divides heads
  int64_t chunk_size = 256;  // 64, 128 or 256: the GPU kernels' chunk length
  DType dtype = DType::bf16;
  DSkip d_skip = DSkip::none;
  bool has_z = false;
  bool has_dt_bias = false;
  bool dt_softplus = false;
  float dt_min = 0.0f;  // clamp of the processed dt; (0, inf) is no clamp
  float dt_max = std::numeric_limits<float>::infinity();
  bool has_initial_states = false;
  bool has_final_states = false;  // forward: write final_states; backward: read d_final_states
  int64_t num_seqs = 0;           // > 0: varlen with cu_seqlens (batch must be 1)
};

// The validated descriptor plus what kernels derive from it.
struct Problem : Descriptor {
  int64_t seqs = 0;             // S: batch, or num_seqs when varlen
  int64_t heads_per_group = 1;  // H / G
  int64_t nchunks = 0;          // ceil(L / chunk_size)
  bool varlen() const { return num_seqs > 0; }
  bool clamps() const { return dt_min > 0.0f || dt_max < std::numeric_limits<float>::infinity(); }
};

// Validates a descriptor (shared by forward and backward); `op` names the op in messages.
Result<Problem> make_problem(std::string_view op, const Descriptor& d);

struct DecodeDescriptor {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t state_dim = 0;
  int64_t ngroups = 1;
  DType dtype = DType::bf16;
  DSkip d_skip = DSkip::none;
  bool has_z = false;
  bool has_dt_bias = false;
  bool dt_softplus = false;
  float dt_min = 0.0f;
  float dt_max = std::numeric_limits<float>::infinity();
};
struct DecodeProblem : DecodeDescriptor {
  int64_t heads_per_group = 1;
};

// ---- stage timing (diagnostics: bench_ssd with BARACUDA_SSD_STAGES=1) ---------------------------
// While a sink is installed, the chunked GPU launchers (forward and backward) record a CUDA event
// before their first kernel and after each kernel, wait for the last event before returning and
// report every kernel's time to the sink, in launch order. With no sink (the default) a launch
// costs one atomic load and records nothing. Only for measurements: with a sink the
// launcher synchronizes its stream (plans otherwise never do), and a launch being captured into a
// CUDA graph reports nothing. The sink is process-wide; install it from one thread.
class StageSink {
 public:
  virtual ~StageSink() = default;
  // `op`: "ssd_forward" / "ssd_backward"; `kernel`: the sku name; `stage`: the launch's name.
  virtual void stage(std::string_view op, std::string_view kernel, std::string_view stage,
                     float ms) = 0;
};
void set_stage_sink(StageSink* sink);  // nullptr turns the timing off
StageSink* stage_sink();

}  // namespace ssd

// ---- forward -----------------------------------------------------------------------------------
struct SsdForwardOp {
  static constexpr std::string_view name = "ssd_forward";
  using Descriptor = ssd::Descriptor;
  using Problem = ssd::Problem;
  struct Arguments {
    Tensor y;
    ConstTensor x, dt, A, B, C;
    ConstTensor D{};               // when d_skip != none
    ConstTensor z{};               // when has_z
    ConstTensor dt_bias{};         // when has_dt_bias
    ConstTensor initial_states{};  // when has_initial_states
    ConstTensor cu_seqlens{};      // when num_seqs > 0
    Tensor final_states{};         // when has_final_states
  };
  static Result<Problem> make_problem(const Descriptor& d) { return ssd::make_problem(name, d); }
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};
using SsdForwardPlan = Plan<SsdForwardOp>;

// ---- backward ----------------------------------------------------------------------------------
// Gradients of L = <dy, y> (+ <d_final_states, final_states>). Every gradient output is written
// in full (no caller zeroing). dB/dC sum over the heads of a group; dA, ddt_bias, dD over tokens.
struct SsdBackwardOp {
  static constexpr std::string_view name = "ssd_backward";
  using Descriptor = ssd::Descriptor;
  using Problem = ssd::Problem;
  struct Arguments {
    ConstTensor x, dt, A, B, C, dy;
    ConstTensor D{}, z{}, dt_bias{}, initial_states{}, cu_seqlens{};
    ConstTensor d_final_states{};  // when has_final_states
    Tensor dx, ddt, dA, dB, dC;
    Tensor dD{};                // when d_skip != none (same shape as D)
    Tensor dz{};                // when has_z
    Tensor ddt_bias{};          // when has_dt_bias
    Tensor d_initial_states{};  // when has_initial_states
  };
  static Result<Problem> make_problem(const Descriptor& d) { return ssd::make_problem(name, d); }
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};
using SsdBackwardPlan = Plan<SsdBackwardOp>;

// ---- decode step -------------------------------------------------------------------------------
// One token per sequence: state [B, H, D, N] f32 is updated in place, y [B, H, D] written.
// x, z, y [B, H, D], dt [B, H], B, C [B, G, N] in the element dtype; A, dt_bias, D as above.
struct SsdDecodeOp {
  static constexpr std::string_view name = "ssd_decode";
  using Descriptor = ssd::DecodeDescriptor;
  using Problem = ssd::DecodeProblem;
  struct Arguments {
    Tensor state, y;
    ConstTensor x, dt, A, B, C;
    ConstTensor D{}, z{}, dt_bias{};
  };
  static Result<Problem> make_problem(const Descriptor& d);
  static DType element(const Problem& p) { return p.dtype; }
  static Status check_arguments(const Problem& p, const Arguments& a, Location where);
};
using SsdDecodePlan = Plan<SsdDecodeOp>;

}  // namespace baracuda

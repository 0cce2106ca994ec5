// The benchmark harness (CUDA only): CUDA-event timing with warm-up and medians, the two ceilings
// measured in the same run (device copy bandwidth, cuBLASLt bf16 GEMM rate), and one JSON line per
// result. Families register a bench function; baracuda-bench runs them all (or a filter).
//
// Peers (PyTorch eager, torch.compile, SDPA backends, mamba_ssm) are timed by scripts/peers.py on
// the same case names; scripts/report.py joins both streams of JSON lines into one table.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "baracuda/core/status.hpp"
#include "baracuda/core/stream.hpp"

namespace baracuda::bench {

struct Ceilings {
  double copy_gbps = 0;    // device-to-device copy, bytes read + bytes written
  double gemm_tflops = 0;  // cuBLASLt bf16 8192^3, f32 accumulation, random data
};
// Measured on first use, once per process.
const Ceilings& ceilings(const Stream& stream);

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  int reps = 0;
};
// Times fn(rotation) with CUDA events on `stream`: `warmup` untimed calls, then `reps` timed ones,
// each timed alone; rotation cycles through [0, rotations) so a case can rotate among input sets
// whose total exceeds the L2. A failing fn aborts the case with its error.
Result<Timing> time_it(const Stream& stream, const std::function<Status(int rotation)>& fn,
                       int rotations = 1, int reps = 30, int warmup = 3);
// Times several candidates for one case alike: `rounds` rounds, each timing every fn `reps` times
// (after one untimed call), the first fn of round r being fns[r % n], so that no candidate always
// runs first (on the H200 a row timed after others read down to 0.88x of the same kernel timed
// first, at the attention backward's long points). Each fn's Timing is over its rounds' medians
// (median, min, max; reps counts every timed call); a failing fn ends with its error and the
// others go on.
std::vector<Result<Timing>> time_interleaved(const Stream& stream,
                                             const std::vector<std::function<Status()>>& fns,
                                             int rounds = 5, int reps = 4);
// Times `runs` calls of fn back to back between one event pair, `rounds` times (after `warmup`
// untimed calls): the per-call time of a steady stream of launches (a decode step repeated over
// layers), which per-call event pairs overstate where the call is a few microseconds of
// launches. median_ms etc. are per call.
Result<Timing> time_back_to_back(const Stream& stream, const std::function<Status()>& fn,
                                 int runs = 200, int rounds = 5, int warmup = 3);
// The host's side of a call: the wall time of `runs` calls of fn (enqueueing only; the stream is
// synchronized after each round, outside the timing), `rounds` times. Where a step is a few
// microseconds of GPU work, this is what bounds a loop of them without CUDA graphs. median_ms
// etc. are per call.
Result<Timing> time_host_enqueue(const Stream& stream, const std::function<Status()>& fn,
                                 int runs = 100, int rounds = 5, int warmup = 3);
// The value of environment variable `name`, empty where it is unset (the benches' run switches:
// BARACUDA_COMMIT, BARACUDA_*_ONLY, ...).
std::string_view env(const char* name);
// Its comma-separated items (empty ones dropped): the benches' kernel lists (BARACUDA_AB, ...).
std::vector<std::string> env_list(const char* name);
// Whether a kernel list from env_list (BARACUDA_ATTN_KERNELS, ...) selects `name`: every name
// where the list is empty (the variable unset).
bool env_list_selects(const std::vector<std::string>& list, std::string_view name);
// Its value as a positive integer; `fallback` where it is unset, not a whole number or not
// positive (the benches' counts and sizes: BARACUDA_AB_ROUNDS, BARACUDA_ATTN_PAGE, ...).
int64_t env_positive(const char* name, int64_t fallback);
// Input sets of `bytes_per_set` needed so that rotating among them spans at least 3x the L2.
int rotations_for(const Stream& stream, int64_t bytes_per_set);

// A device buffer of `count` elements of `t` holding random values in [lo, hi] (never zeros:
// zeros hide unwritten outputs and can run faster than real data). A random block of up to 4 Mi
// elements is drawn on the host and tiled over the buffer, which keeps set-up fast for GiB inputs.
Result<Buffer> random_buffer(const Stream& stream, DType t, int64_t count, uint64_t seed,
                             double lo = -1.0, double hi = 1.0);

struct Row {
  std::string family;
  std::string op;    // e.g. "swiglu_forward"
  std::string name;  // case name, shared with the peer script: e.g. "16384x28672"
  std::string dtype;
  std::string kernel;  // sku name of the plan that ran
  double ms = 0;       // median
  double bytes = 0;    // fewest bytes the op must move: inputs read once + outputs written once
  double flops = 0;    // 0 for memory-bound ops
  std::string note;
};
// Prints the row as one JSON line on stdout with GB/s, TFLOP/s, % of the relevant ceiling,
// the device name, BARACUDA_COMMIT and the date.
void emit(const Stream& stream, const Row& row);
// Prints a failure as a JSON line (so a broken case is visible, never silently missing).
void emit_error(const std::string& family, const std::string& op, const std::string& name,
                const Error& error);

using BenchFn = void (*)(const Stream& stream);
bool register_bench(std::string_view family, BenchFn fn);

}  // namespace baracuda::bench

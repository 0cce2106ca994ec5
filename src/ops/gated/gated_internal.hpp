// Internals shared by the gated family's plan, reference, kernels and tests.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "baracuda/ops/gated.hpp"

namespace baracuda::gated {

// Every layout reduces to one elementwise pass over the output shape with up to five operands,
// each a strided view: a, b (inputs), then y (forward) or dy, da, db (backward). Halves and
// interleaved inputs are two views into x (and dx): halves offset b by n * stride[split];
// interleaved offsets b by one stride and doubles the split-axis stride.
struct Views {
  enum : int { a = 0, b = 1, y = 2, dy = 2, da = 3, db = 4 };
  int rank = 0;
  int count = 0;  // 3 forward, 5 backward
  std::array<int64_t, kMaxRank> shape{};
  std::array<char*, 5> ptr{};
  std::array<std::array<int64_t, kMaxRank>, 5> stride{};
};

Views forward_views(const GatedProblem& p, const GatedForwardOp::Arguments& args);
Views backward_views(const GatedProblem& p, const GatedBackwardOp::Arguments& args);

// Drops size-1 axes and merges neighbouring axes that are contiguous in every operand, so a dense
// [M, 2N] split on the last axis becomes rows of N unit-stride elements.
void collapse(Views& v);

// The float64 reference on logical (row-major) values, independent of strides: the test oracle.
// `first` holds x (halves, interleaved) or a (separate); `second` holds b (separate only).
std::vector<double> forward_logical(const GatedProblem& p, const std::vector<double>& first,
                                    const std::vector<double>& second);
// Returns dx (halves, interleaved; `second_grad` untouched) or da with db in `second_grad`.
std::vector<double> backward_logical(const GatedProblem& p, const std::vector<double>& first,
                                     const std::vector<double>& second,
                                     const std::vector<double>& dy,
                                     std::vector<double>* second_grad);

// ---- CUDA path choice (host code, so CPU tests can check which path a layout takes) ----------
// rows: every operand unit-stride on the innermost axis and every row 16-byte aligned;
// rows_unaligned: unit-stride, but rows start at any element boundary, the same one (mod 16
// bytes) in every operand: the tiles kernel with a scalar head and tail per row; pairs: a and b
// interleaved (gpt-oss layout); strided: anything else.
enum class Path { rows, rows_unaligned, pairs, strided };
const char* to_string(Path p);

// Pair bases of the pairs path: x (and dx) point at the first element of the first pair;
// gate_first says whether that element is b. x is null when the layout is not pairs.
struct PairBases {
  const char* x = nullptr;
  char* dx = nullptr;
  bool gate_first = false;
};
PairBases pairs_fit(const Views& v, int64_t elem_bytes, bool backward);

// The kernels that can serve the rows paths. `legacy`: the 2-vector grid-stride kernel of commit
// 718446f, aligned rows only (misaligned rows then take the strided kernel). `tiles`: each block
// walks tiles of one row (kThreads x 2 or 4 vectors), grid-strided with one wave of blocks; also
// serves misaligned rows (scalar row ends). `tiles_full_grid`: the same with one block per tile
// (the fastest of the three for bf16 forward and misaligned rows on the H100, b401dcb).
enum class RowsKernel : int { legacy, tiles, tiles_full_grid };
const char* to_string(RowsKernel k);

// One row of the selection table: the rows kernel for a (dtype, direction, row alignment).
struct RowsChoice {
  DType dtype;
  bool backward;
  bool aligned;  // rows 16-byte aligned (Path::rows) or not (would be Path::rows_unaligned)
  RowsKernel kernel;
};
// The table (plan.cpp, filled from device measurements: docs/perf/gated.md); a case it does not
// list takes the legacy kernel (misaligned rows: the strided kernel).
std::span<const RowsChoice> rows_table();
// A registered kernel's pin: < 0 takes the rows kernel from the table, else that RowsKernel.
constexpr std::optional<RowsKernel> pinned_rows_kernel(int pin) {
  return pin < 0 ? std::nullopt : std::optional<RowsKernel>(static_cast<RowsKernel>(pin));
}

// The kernel for a case: `pinned` if given, else the table's.
RowsKernel rows_kernel_for(DType t, bool backward, bool aligned,
                           std::optional<RowsKernel> pinned = std::nullopt);
// The registered CUDA kernels of a direction: the table's choice ("gated_forward_cuda") and one
// per rows kernel pinned ("gated_forward_rows_<kernel>"), reached with PlanPreference::kernel (the
// tests check every one, the benchmark A/Bs them).
std::string_view cuda_kernel_name(bool backward, std::optional<RowsKernel> pinned);

// `v` collapsed (see collapse). Misaligned rows take rows_unaligned only when the rows kernel
// (pinned, or the table's) is a tiles kernel.
Path choose_path(const Views& v, DType t, bool backward,
                 std::optional<RowsKernel> pinned = std::nullopt);

// Scalar float64 formulas (reference.cpp).
double reference_forward(Gate g, double alpha, double limit, double a, double b);
void reference_backward(Gate g, double alpha, double limit, double a, double b, double dy,
                        double* da, double* db);

}  // namespace baracuda::gated

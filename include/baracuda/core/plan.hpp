// Plans: descriptor -> select -> can_implement -> workspace_size -> run.
//
// An op family is a small traits struct `Op` with
//   name                        "write_slice"
//   Descriptor                  what the caller fills (shapes, dtype, variant)
//   Arguments                   the tensors (and device scalars) of one run
//   Problem                     the validated, normalized descriptor that kernels see
//   make_problem(desc)          -> Result<Problem>: every descriptor rule, with precise errors
//   element(problem)            -> DType the kernel table is keyed on
//   check_arguments(problem, args, where) -> Status: shape/stride/dtype/extent/placement rules
// Kernels register themselves in KernelTable<Op> with their SKU and a predicate; Plan<Op>::select
// ranks what fits the stream's target and the caller's preference. No family writes its own
// dispatch switch: the table is the dispatch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "baracuda/core/dtype.hpp"
#include "baracuda/core/status.hpp"
#include "baracuda/core/stream.hpp"
#include "baracuda/core/tensor.hpp"

namespace baracuda {

enum class Backend : uint8_t { cpu_reference, bespoke_cuda, cublaslt, cudnn, cutlass };
std::string_view to_string(Backend b);

// The oldest GPU architecture a kernel runs on (sm90a: Hopper only, arch-specific instructions).
enum class Arch : uint8_t { cpu, sm80, sm89, sm90, sm90a };
std::string_view to_string(Arch a);
bool arch_runs_on(Arch kernel_arch, const DeviceCaps& caps);

// e4m3: operands rounded to fp8 E4M3 (e.g. attention's P before P V).
// Listed from the most precise to the least (detail::weakest relies on the order).
enum class MathPrecision : uint8_t { exact, f64, f32, tf32, f16, bf16, e4m3 };
std::string_view to_string(MathPrecision m);

struct PrecisionGuarantee {
  MathPrecision math = MathPrecision::exact;  // precision of the arithmetic (exact: copies only)
  DType accumulator = DType::f64;             // type that sums/reductions accumulate in
  bool deterministic = true;                  // same inputs, same plan -> same bits, every run
  bool bit_stable = true;  // a row's result does not depend on the problem size or batch split
};
std::string to_string(const PrecisionGuarantee& p);

// What a kernel is. Strings point at static storage.
struct KernelSku {
  std::string_view category;  // "data_movement", "activation", "attention", "scan", ...
  std::string_view op;        // "write_slice", "gated_forward", ...
  DType element = DType::f32;
  std::optional<DType> aux_element =
      std::nullopt;                     // a second element type (LSE, parameters), if any
  std::string_view layout = "strided";  // "contiguous", "strided", "kv_2d", ...
  std::string_view epilogue = "none";   // variant / fused epilogue
  Arch arch = Arch::cpu;
  Backend backend = Backend::cpu_reference;
  PrecisionGuarantee precision{};
  std::string_view name;  // unique kernel name within the op
};
std::string to_string(const KernelSku& s);

struct PlanPreference {
  enum class Kind : uint8_t { fastest, deterministic, backend, reference, kernel };
  Kind kind = Kind::fastest;
  Backend backend = Backend::bespoke_cuda;
  // Kind::kernel: the one kernel (KernelSku::name) to run, still only where its predicate fits.
  // For A/B benchmarks and for tests that check every kernel; the view must outlive select().
  std::string_view kernel_name;

  static PlanPreference fastest() { return {}; }
  static PlanPreference deterministic() { return {Kind::deterministic, Backend::bespoke_cuda, {}}; }
  static PlanPreference only(Backend b) { return {Kind::backend, b, {}}; }
  static PlanPreference reference() { return {Kind::reference, Backend::cpu_reference, {}}; }
  static PlanPreference kernel(std::string_view name) {
    return {Kind::kernel, Backend::bespoke_cuda, name};
  }
};
std::string to_string(const PlanPreference& p);

struct LaunchContext {
  const Stream& stream;
  Workspace workspace;
};

template <class Op>
struct Kernel {
  KernelSku sku;
  int priority = 0;  // among kernels that fit, the highest runs (fastest first)
  bool (*fits)(const typename Op::Problem&, const DeviceCaps&) = nullptr;         // null: always
  size_t (*workspace)(const typename Op::Problem&, const DeviceCaps&) = nullptr;  // null: none
  Status (*launch)(const LaunchContext&, const typename Op::Problem&,
                   const typename Op::Arguments&) = nullptr;
  // The kernel's own argument rules on top of the op's (the alignment and strides its vector or
  // TMA loads need): can_implement applies them, so a run that launch would refuse is refused
  // before anything is enqueued; launch may take them as given. null: none.
  Status (*check)(const typename Op::Problem&, const typename Op::Arguments&) = nullptr;
  // Why `fits` refuses a problem, where the kernel can say more than its name (a library's own
  // rules): select's error quotes it when nothing fits the preference. nullopt: no refusal to
  // report (e.g. a rank-ordering entry that steps aside for its twin). null: none said.
  std::optional<std::string> (*refusal)(const typename Op::Problem&, const DeviceCaps&) = nullptr;
};

// ---- The global op matrix ----------------------------------------------------------------------
namespace detail {
using SkuLister = std::vector<KernelSku> (*)();
void register_table(std::string_view family, SkuLister lister);
}  // namespace detail

struct RegisteredKernel {
  std::string_view family;
  KernelSku sku;
};
// Every registered kernel of every family, in registration order (baracuda-info prints this).
std::vector<RegisteredKernel> registered_kernels();

template <class Op>
class KernelTable {
 public:
  static KernelTable& instance() {
    static KernelTable table;
    return table;
  }
  void add(const Kernel<Op>& k) { kernels_.push_back(k); }
  // A deque keeps every entry's address stable: plans point at their kernel's entry.
  const std::deque<Kernel<Op>>& all() const { return kernels_; }
  // The first entry registered under this name for this element type (null: none).
  const Kernel<Op>* find(std::string_view name, DType element) const {
    for (const Kernel<Op>& k : kernels_)
      if (k.sku.name == name && k.sku.element == element) return &k;
    return nullptr;
  }

 private:
  KernelTable() { detail::register_table(Op::name, &list); }
  static std::vector<KernelSku> list() {
    std::vector<KernelSku> out;
    for (const auto& k : instance().kernels_) out.push_back(k.sku);
    return out;
  }
  std::deque<Kernel<Op>> kernels_;
};

template <class Op>
bool register_kernel(const Kernel<Op>& k) {
  KernelTable<Op>::instance().add(k);
  return true;
}

namespace detail {
bool preference_admits(const PlanPreference& pref, const KernelSku& sku);
// `refusals`: "<kernel>: <why>" of the kernels the preference admitted whose fits refused.
Error no_kernel_error(std::string_view op, DType element, const Stream& stream,
                      const PlanPreference& pref, const std::vector<KernelSku>& candidates,
                      const std::vector<std::string>& refusals = {});
Status check_run_target(std::string_view op, const DeviceCaps& plan_caps, const Stream& stream);
Status check_workspace(std::string_view op, size_t needed, const Workspace& ws,
                       const Stream& stream);
// The terms two kernels both keep: the less precise math, the narrower accumulator, determinism
// and bit-stability only where both have them.
PrecisionGuarantee weakest(const PrecisionGuarantee& a, const PrecisionGuarantee& b);
}  // namespace detail

template <class Op>
class Plan {
 public:
  using Descriptor = typename Op::Descriptor;
  using Arguments = typename Op::Arguments;
  using Problem = typename Op::Problem;

  static Result<Plan> select(const Stream& stream, const Descriptor& desc,
                             PlanPreference pref = PlanPreference::fastest()) {
    Result<Problem> problem = Op::make_problem(desc);
    if (!problem.ok()) return problem.error();
    const DType element = Op::element(problem.value());
    const Kernel<Op>* best = nullptr;
    // The best candidate without argument rules of its own: it takes every view the op accepts.
    // Of those, the best deterministic one too: a deterministic choice falls back to it, so that
    // a view the chosen kernel refuses does not cost the plan its determinism.
    const Kernel<Op>* general = nullptr;
    const Kernel<Op>* general_deterministic = nullptr;
    std::vector<KernelSku> same_element;
    auto admitted = [&](const Kernel<Op>& k) {
      const bool on_target = stream.is_cpu() ? k.sku.backend == Backend::cpu_reference
                                             : (k.sku.backend != Backend::cpu_reference &&
                                                arch_runs_on(k.sku.arch, stream.caps()));
      return on_target && detail::preference_admits(pref, k.sku);
    };
    for (const Kernel<Op>& k : KernelTable<Op>::instance().all()) {
      if (k.sku.element != element) continue;
      same_element.push_back(k.sku);
      if (!admitted(k)) continue;
      if (k.fits && !k.fits(problem.value(), stream.caps())) continue;
      if (!best || k.priority > best->priority) best = &k;
      if (k.check) continue;
      if (!general || k.priority > general->priority) general = &k;
      if (k.sku.precision.deterministic &&
          (!general_deterministic || k.priority > general_deterministic->priority))
        general_deterministic = &k;
    }
    if (best && best->sku.precision.deterministic && general_deterministic)
      general = general_deterministic;
    if (!best) {
      // The error path only: ask the admitted kernels that can say why they refused.
      std::vector<std::string> refusals;
      for (const Kernel<Op>& k : KernelTable<Op>::instance().all())
        if (k.sku.element == element && k.refusal && admitted(k))
          if (auto why = k.refusal(problem.value(), stream.caps()))
            refusals.push_back(std::string(k.sku.name) + ": " + *why);
      return detail::no_kernel_error(Op::name, element, stream, pref, same_element, refusals);
    }
    Plan plan;
    plan.problem_ = std::move(problem).value();
    plan.kernel_ = best;
    plan.caps_ = stream.caps();
    plan.kernel_workspace_ = best->workspace ? best->workspace(plan.problem_, plan.caps_) : 0;
    plan.precision_ = best->sku.precision;
    // Views the chosen kernel's own rules refuse (Kernel::check: e.g. cuDNN's 16-byte row
    // strides) still satisfy the op, so the plan runs them on the general candidate instead of
    // failing a valid call. The workspace covers both; the guarantee is what both keep.
    if (best->check && general) {
      plan.fallback_ = general;
      plan.fallback_workspace_ =
          general->workspace ? general->workspace(plan.problem_, plan.caps_) : 0;
      plan.precision_ = detail::weakest(best->sku.precision, general->sku.precision);
    }
    return plan;
  }

  // Validates the tensors against the plan (shape, stride, dtype, extent, placement). Launches
  // nothing; run() calls it too, so a run with bad arguments never writes.
  Status can_implement(const Arguments& args) const {
    const Result<const Kernel<Op>*> k = route(args);
    if (!k.ok()) return k.error();
    return {};
  }
  // Enough for every run of the plan, whichever of its kernels the views lead to.
  size_t workspace_size() const { return std::max(kernel_workspace_, fallback_workspace_); }
  // Exactly what run(args) needs (at most workspace_size()); 0 where can_implement(args) fails.
  size_t workspace_size(const Arguments& args) const {
    const Result<const Kernel<Op>*> k = route(args);
    return k.ok() ? workspace_of(*k.value()) : 0;
  }
  // The kernel select() chose. With a fallback, views its rules refuse run on fallback_sku().
  const KernelSku& sku() const { return kernel_->sku; }
  // The kernel run(args) launches (sku() where can_implement(args) fails).
  const KernelSku& sku(const Arguments& args) const {
    const Result<const Kernel<Op>*> k = route(args);
    return k.ok() ? k.value()->sku : kernel_->sku;
  }
  const KernelSku* fallback_sku() const { return fallback_ ? &fallback_->sku : nullptr; }
  // What every run of the plan promises (with a fallback: the weaker of the two kernels' terms).
  const PrecisionGuarantee& precision_guarantee() const { return precision_; }
  const Problem& problem() const { return problem_; }

  // Never allocates, never synchronizes (on a CPU stream the work itself runs on this thread).
  Status run(const Stream& stream, Workspace workspace, const Arguments& args) const {
    BARACUDA_TRY(detail::check_run_target(Op::name, caps_, stream));
    const Result<const Kernel<Op>*> k = route(args);
    if (!k.ok()) {  // the workspace is judged first, as for any refused call
      BARACUDA_TRY(detail::check_workspace(Op::name, workspace_size(), workspace, stream));
      return k.error();
    }
    const Kernel<Op>& kernel = *k.value();
    BARACUDA_TRY(detail::check_workspace(Op::name, workspace_of(kernel), workspace, stream));
    return kernel.launch(LaunchContext{stream, workspace}, problem_, args);
  }

 private:
  Plan() = default;
  // The kernel these arguments run on, or why they are refused: the op's rules, then the chosen
  // kernel's own, which send a view they refuse to the fallback where there is one.
  Result<const Kernel<Op>*> route(const Arguments& args) const {
    const Location where = caps_.device < 0 ? Location::host() : Location::cuda(caps_.device);
    BARACUDA_TRY(Op::check_arguments(problem_, args, where));
    if (!kernel_->check) return kernel_;
    Status own = kernel_->check(problem_, args);
    if (own.ok()) return kernel_;
    if (fallback_) return fallback_;
    return own.error();
  }
  size_t workspace_of(const Kernel<Op>& k) const {
    return &k == fallback_ ? fallback_workspace_ : kernel_workspace_;
  }

  Problem problem_{};
  const Kernel<Op>* kernel_ = nullptr;
  const Kernel<Op>* fallback_ = nullptr;  // set only when kernel_ has a check
  DeviceCaps caps_;
  size_t kernel_workspace_ = 0, fallback_workspace_ = 0;
  PrecisionGuarantee precision_{};
};

}  // namespace baracuda

#define BARACUDA_CONCAT_INNER(a, b) a##b
#define BARACUDA_CONCAT(a, b) BARACUDA_CONCAT_INNER(a, b)
// Registers kernels at static-initialization time from any translation unit:
//   BARACUDA_REGISTER(register_kernel<MyOp>({...}));
#define BARACUDA_REGISTER(expr) \
  [[maybe_unused]] static const bool BARACUDA_CONCAT(baracuda_registered_, __COUNTER__) = (expr)

#include "baracuda/core/plan.hpp"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace baracuda {

std::string_view to_string(Backend b) {
  switch (b) {
    case Backend::cpu_reference:
      return "cpu_reference";
    case Backend::bespoke_cuda:
      return "bespoke_cuda";
    case Backend::cublaslt:
      return "cublaslt";
    case Backend::cudnn:
      return "cudnn";
    case Backend::cutlass:
      return "cutlass";
  }
  return "?";
}

std::string_view to_string(Arch a) {
  switch (a) {
    case Arch::cpu:
      return "cpu";
    case Arch::sm80:
      return "sm_80";
    case Arch::sm89:
      return "sm_89";
    case Arch::sm90:
      return "sm_90";
    case Arch::sm90a:
      return "sm_90a";
  }
  return "?";
}

bool arch_runs_on(Arch a, const DeviceCaps& caps) {
  switch (a) {
    case Arch::cpu:
      return caps.device < 0;
    case Arch::sm80:
      return caps.sm >= 80;
    case Arch::sm89:
      return caps.sm >= 89;
    case Arch::sm90:
      return caps.sm >= 90;
    case Arch::sm90a:
      return caps.sm == 90;
  }
  return false;
}

std::string_view to_string(MathPrecision m) {
  switch (m) {
    case MathPrecision::exact:
      return "exact";
    case MathPrecision::f64:
      return "f64";
    case MathPrecision::f32:
      return "f32";
    case MathPrecision::tf32:
      return "tf32";
    case MathPrecision::f16:
      return "f16";
    case MathPrecision::bf16:
      return "bf16";
    case MathPrecision::e4m3:
      return "e4m3";
  }
  return "?";
}

std::string to_string(const PrecisionGuarantee& p) {
  std::string s =
      "math=" + std::string(to_string(p.math)) + " acc=" + std::string(name(p.accumulator));
  s += p.deterministic ? " deterministic" : " nondeterministic";
  if (p.bit_stable) s += " bit-stable";
  return s;
}

std::string to_string(const KernelSku& k) {
  std::string s(k.op);
  s += "/" + std::string(k.name) + " " + std::string(name(k.element));
  if (k.aux_element && *k.aux_element != k.element) s += "+" + std::string(name(*k.aux_element));
  s += " " + std::string(k.layout) + " " + std::string(k.epilogue) + " " +
       std::string(to_string(k.arch)) + " " + std::string(to_string(k.backend)) + " [" +
       to_string(k.precision) + "]";
  return s;
}

std::string to_string(const PlanPreference& p) {
  switch (p.kind) {
    case PlanPreference::Kind::fastest:
      return "fastest";
    case PlanPreference::Kind::deterministic:
      return "deterministic";
    case PlanPreference::Kind::backend:
      return "backend=" + std::string(to_string(p.backend));
    case PlanPreference::Kind::reference:
      return "reference";
    case PlanPreference::Kind::kernel:
      return "kernel=" + std::string(p.kernel_name);
  }
  return "?";
}

namespace {
struct Table {
  std::string_view family;
  detail::SkuLister lister;
};
std::vector<Table>& tables() {
  static std::vector<Table> t;
  return t;
}
std::mutex& tables_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

namespace detail {

void register_table(std::string_view family, SkuLister lister) {
  std::lock_guard<std::mutex> lock(tables_mutex());
  tables().push_back({family, lister});
}

bool preference_admits(const PlanPreference& pref, const KernelSku& sku) {
  switch (pref.kind) {
    case PlanPreference::Kind::fastest:
      return true;
    case PlanPreference::Kind::deterministic:
      return sku.precision.deterministic;
    case PlanPreference::Kind::backend:
      return sku.backend == pref.backend;
    case PlanPreference::Kind::reference:
      return sku.backend == Backend::cpu_reference;
    case PlanPreference::Kind::kernel:
      return sku.name == pref.kernel_name;
  }
  return false;
}

Error no_kernel_error(std::string_view op, DType element, const Stream& stream,
                      const PlanPreference& pref, const std::vector<KernelSku>& candidates,
                      const std::vector<std::string>& refusals) {
  std::string target = stream.is_cpu() ? std::string("cpu")
                                       : "cuda:" + std::to_string(stream.device()) + " (sm_" +
                                             std::to_string(stream.caps().sm) + ")";
  std::string msg = std::string(op) + ": no kernel for element=" + std::string(name(element)) +
                    " on " + target + " with preference=" + to_string(pref);
  if (pref.kind == PlanPreference::Kind::reference && stream.is_cuda())
    msg += " (the reference backend runs on CPU streams only)";
  for (const auto& r : refusals) msg += "; refused by " + r;
  if (candidates.empty()) {
    msg += "; no kernel is registered for this element type";
  } else {
    msg += "; registered for this element:";
    for (const auto& c : candidates)
      msg += " " + std::string(c.name) + "(" + std::string(to_string(c.backend)) + "," +
             std::string(to_string(c.arch)) + ")";
  }
  return Error::unsupported(msg);
}

Status check_run_target(std::string_view op, const DeviceCaps& plan_caps, const Stream& stream) {
  if (plan_caps.device != stream.device()) {
    auto where = [](int d) { return d < 0 ? std::string("cpu") : "cuda:" + std::to_string(d); };
    return Error::wrong_device(std::string(op) + ": stream: plan was selected for " +
                               where(plan_caps.device) + " but run on " + where(stream.device()));
  }
  return {};
}

Status check_workspace(std::string_view op, size_t needed, const Workspace& ws,
                       const Stream& stream) {
  if (needed == 0) return {};
  if (ws.bytes < needed || ws.data == nullptr)
    return Error::workspace_too_small(std::string(op) + ": workspace: needs " +
                                          std::to_string(needed) + " bytes, got " +
                                          std::to_string(ws.data ? ws.bytes : 0),
                                      needed, ws.data ? ws.bytes : 0);
  if (reinterpret_cast<uintptr_t>(ws.data) % kWorkspaceAlignment != 0)
    return Error::misaligned(std::string(op) + ": workspace: data must be " +
                             std::to_string(kWorkspaceAlignment) + "-byte aligned");
  if (!(ws.where == stream.memory_location()))
    return Error::wrong_device(std::string(op) + ": workspace: lives on " + to_string(ws.where) +
                               " but the stream runs on " + to_string(stream.memory_location()));
  return {};
}

PrecisionGuarantee weakest(const PrecisionGuarantee& a, const PrecisionGuarantee& b) {
  // MathPrecision lists the modes from the most precise to the least.
  return {std::max(a.math, b.math),
          bits_of(a.accumulator) <= bits_of(b.accumulator) ? a.accumulator : b.accumulator,
          a.deterministic && b.deterministic, a.bit_stable && b.bit_stable};
}

}  // namespace detail

std::vector<RegisteredKernel> registered_kernels() {
  std::vector<Table> snapshot;
  {
    std::lock_guard<std::mutex> lock(tables_mutex());
    snapshot = tables();
  }
  std::vector<RegisteredKernel> out;
  for (const auto& t : snapshot)
    for (const auto& sku : t.lister()) out.push_back({t.family, sku});
  return out;
}

}  // namespace baracuda

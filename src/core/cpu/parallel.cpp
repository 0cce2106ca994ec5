#include <atomic>

#include "baracuda/core/stream.hpp"
#include "core/cpu/parallel.hpp"

namespace baracuda {
namespace {
std::atomic<int64_t> g_cpu_threads{0};  // 0: the host's cores
}  // namespace

int64_t cpu_threads() {
  const int64_t set = g_cpu_threads.load(std::memory_order_relaxed);
  return set > 0 ? set : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

void set_cpu_threads(int64_t n) {
  g_cpu_threads.store(std::max<int64_t>(n, 0), std::memory_order_relaxed);
}

}  // namespace baracuda

#include "core/cpu/parallel.hpp"

#include <atomic>

namespace baracuda::cpu {
namespace {
std::atomic<int64_t> g_max_threads{0};
}  // namespace

int64_t max_threads() {
  const int64_t set = g_max_threads.load(std::memory_order_relaxed);
  return set > 0 ? set : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

void set_max_threads(int64_t n) {
  g_max_threads.store(std::max<int64_t>(n, 0), std::memory_order_relaxed);
}

}  // namespace baracuda::cpu

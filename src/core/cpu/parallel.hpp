// Host-side parallelism for the CPU backends and the tests' float64 references.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "baracuda/core/stream.hpp"

namespace baracuda::cpu {

// fn(0) .. fn(n - 1) on up to `threads` threads (0: cpu_threads(), the caller's cap). Each index
// runs whole on one thread, so a caller whose indices write disjoint outputs and keep their own
// scratch gets the same bits whatever the thread count: the CPU backends keep their determinism and
// bit-stability.
template <class Fn>
void parallel_for(int64_t n, Fn fn, int64_t threads = 0) {
  if (threads <= 0) threads = cpu_threads();
  const int64_t workers = std::min<int64_t>(n, threads);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // An exception (std::bad_alloc from a slice's scratch) reaches the caller as it would without
  // threads: the first one is rethrown after every worker has stopped taking indices.
  std::atomic<int64_t> next{0};
  std::mutex failed_mutex;
  std::exception_ptr failed;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      try {
        for (int64_t i = next++; i < n; i = next++) fn(i);
      } catch (...) {
        next = n;
        const std::lock_guard<std::mutex> lock(failed_mutex);
        if (!failed) failed = std::current_exception();
      }
    });
  for (auto& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace baracuda::cpu

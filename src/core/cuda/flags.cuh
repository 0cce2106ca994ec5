// Block-to-block hand-offs inside one launch: a ticket that orders blocks by the time they start,
// and ready flags published with release and awaited with acquire (GPU scope). A block may wait
// only on blocks holding smaller tickets: those are already running, so the waits always end.
// Include only from .cu files.
#pragma once

#include <cstdint>

namespace baracuda::cuda {

// This block's ticket: 0, 1, 2, ... in the order blocks reach it (the counter zeroed before the
// launch). Call from every thread; returns the same value in all of them.
__device__ __forceinline__ unsigned block_ticket(unsigned* counter) {
  __shared__ unsigned ticket;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) ticket = atomicAdd(counter, 1u);
  __syncthreads();
  const unsigned t = ticket;
  __syncthreads();  // so that a second call cannot overwrite it before everyone read it
  return t;
}

// Publishes what this block wrote before the call: every thread's stores, then one release store.
// Call from every thread.
__device__ __forceinline__ void publish_block(unsigned* flag, unsigned value) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
  }
}

// Waits until *flag == value (one thread polls, backing off), then makes what its publisher wrote
// visible to the whole block. Call from every thread; read the published data with ld.global.cg
// (__ldcg) or later loads that cannot hit a stale L1 line.
__device__ __forceinline__ void await_block(const unsigned* flag, unsigned value) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    unsigned seen, pause = 32;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
      if (seen == value) break;
      __nanosleep(pause);
      pause = pause < 1024 ? 2 * pause : pause;
    }
  }
  __syncthreads();
}

}  // namespace baracuda::cuda

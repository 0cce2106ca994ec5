// Block-to-block hand-offs inside one launch: a ticket that orders blocks by the time they start,
// ready flags published with release and awaited with acquire (GPU scope), relaxed counts that put
// bulk reductions in a fixed order, and group flags that tell the last block of a group it is last.
// A block may wait only on blocks holding smaller tickets: those are already running, so the waits
// always end. Include only from .cu files.
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

// A count that only rises, for bulk async reductions into one buffer made in a fixed order: each
// publisher adds 1 once its own reductions have completed (raise_count_after_completion), and the
// next one polls until *count >= value before it issues its own. Every access is relaxed (GPU
// scope): the reductions are performed in L2, where every later one to the buffer is, before the
// count is even raised, and the waiter reads nothing the publishers wrote, so neither the release's
// MEMBAR.ALL.GPU nor the acquire's L1 invalidation (CCTL.IVALL, which waits for the load) orders
// anything that is not ordered already. The PTX memory model asks for both; fa3_backward.cuh
// says what each cost. A waiter that reads the publishers' data needs await_block instead.
// peek_count is one reading; await_count starts from one taken earlier (`seen`): the load's round
// trip to L2 (about 300 ns, H200) stalls nothing until its value is used, and a count already
// high enough costs nothing then. The pause between polls doubles from 32 ns up to max_pause_ns:
// a waiter whose turn comes within a microsecond or so keeps it at 32 (a longer sleep is time it
// trails by).
__device__ __forceinline__ unsigned peek_count(const unsigned* count) {
  unsigned seen;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
  return seen;
}
__device__ __forceinline__ void await_count(const unsigned* count, unsigned value, unsigned seen,
                                            unsigned max_pause_ns = 1024) {
  for (unsigned pause = 32; seen < value; seen = peek_count(count)) {
    __nanosleep(pause);
    pause = pause < max_pause_ns ? 2 * pause : pause;
  }
}
__device__ __forceinline__ void raise_count_after_completion(unsigned* count, unsigned by = 1) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(count), "r"(by) : "memory");
}

// Raises this block's flag in a group of `count` blocks (flags[mine] = tag, after every thread's
// stores) and reads the group's flags: true where all of them hold tag. For a merge by whichever
// block of a group finishes last, with nothing to initialize. One SC fence a block: the barrier
// puts every thread's stores and thread 0's release store of the flag before each lane's fence.sc,
// and the scan's loads after it, so of any two blocks of a group at least one sees the other's
// flag, and the block whose earliest fence comes last in the fences' order sees every flag (two
// finishing together may both get true). The stores reach a reader through the release, cumulative
// over what the barrier ordered before it. (Until the eighty-eighth session every thread took an SC
// fence before the raise and the merging block another after the scan: the fused decode then ran 10
// us longer than the split kernel whose loop it shares, H200, ncu.) With true, what the others
// wrote before their raise is visible after the acquire fence (read it with __ldcg). The tag must
// differ from whatever the flags may hold before the launch (unique per launch, never the cleared
// value 0); clear_flags resets a group once its readers are done. Needs a full first warp; call
// from every thread; returns the same value in all. `all_raised`: an int of the block's dynamic
// shared memory for the verdict. Not a static __shared__ variable: with one (16 bytes beside the
// decode's 100 KB of dynamic shared memory) the fused decode ran 20% longer than the split kernel
// where no split merges at all (H200, b12 Lk 2048 d128, one split a group: 37.4 against 30.8 us);
// with the verdict in dynamic shared memory 30.9 (docs/perf/attention.md, ninetieth session).
__device__ __forceinline__ bool raise_flag_and_see_all(unsigned long long* flags, int count,
                                                       int mine, unsigned long long tag,
                                                       int* all_raised) {
  __syncthreads();
  if (threadIdx.x < 32 && threadIdx.y == 0 && threadIdx.z == 0) {
    if (threadIdx.x == 0)
      asm volatile("st.release.gpu.global.u64 [%0], %1;\n" ::"l"(flags + mine), "l"(tag)
                   : "memory");
    __syncwarp();
    asm volatile("fence.sc.gpu;\n" ::: "memory");
    bool all = true;
    for (int i = static_cast<int>(threadIdx.x); i < count; i += 32) {
      unsigned long long seen;
      asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n"
                   : "=l"(seen)
                   : "l"(flags + i)
                   : "memory");
      all &= seen == tag;
    }
    all = __all_sync(0xffffffffu, all);
    // Acquire: every lane that read a raised flag fences before the block reads what was published.
    if (all) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
    if (threadIdx.x == 0) *all_raised = all;
  }
  __syncthreads();
  return *all_raised != 0;
}

// Clears a group's flags for the next launch, once every block that reads them is done with
// them. Call from every thread.
__device__ __forceinline__ void clear_flags(unsigned long long* flags, int count) {
  const int threads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int t =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  for (int i = t; i < count; i += threads)
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(flags + i), "l"(0ull) : "memory");
}

}  // namespace baracuda::cuda

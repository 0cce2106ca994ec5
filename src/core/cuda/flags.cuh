// Block-to-block hand-offs inside one launch: a ticket that orders blocks by the time they start,
// ready flags published with release and awaited with acquire (GPU scope), relaxed counts that put
// bulk reductions in a fixed order, and group flags that tell one block of a group to merge it.
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

// A merge by one block of a group of `splits` blocks (a split-K reduction in the same launch):
// started[splits], done[splits] and one handoff word, each set to the launch's tag (unique per
// launch, never 0) or cleared to 0. Split 0 merges without any SC fence where it sees every other
// split started (it may load the marks early, early_started_mark, ahead of its own last work): they
// are running, so it may wait for their done flags (release stores by the raiser, acquire loads
// here). Where a split has not started (a grid larger than the device holds, or other work on the
// SMs), split 0 raises its own done flag and the handoff word and every block takes the
// last-finisher path: raise done, SC fence, read every done flag and the handoff word; the block
// whose fence comes last sees all of them (two may both merge, with the same bits). The other
// splits run that path's fence and reads after their done flag in any case (off split 0's critical
// path): where split 0 handed off before, they see it.
struct GroupMergeFlags {
  unsigned long long* started;  // [splits], then done [splits], then the handoff word
  int splits;
  // Words a group of `count` blocks takes (the caller's workspace layout counts them so too).
  __host__ __device__ static constexpr int64_t words(int64_t count) { return 2 * count + 1; }
  __device__ GroupMergeFlags(unsigned long long* first, int count)
      : started(first), splits(count) {}
  __device__ unsigned long long* done() const { return started + splits; }
  __device__ unsigned long long* handoff() const { return started + 2 * splits; }
  __device__ void mark_started(int split, unsigned long long tag) const {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(started + split), "l"(tag)
                 : "memory");
  }
  // Split 0's first look at the started marks: lane l of warp 0 loads split l + 1's (the tag
  // where there is none). Taken before the block's last work (its partials) so that the round
  // trip overlaps it; merges_here compares it then and loads any marks past split 32 itself.
  __device__ unsigned long long early_started_mark(unsigned long long tag) const {
    const int i = static_cast<int>(threadIdx.x % 32) + 1;
    return i < splits ? load(started + i) : tag;
  }
  // Whether this block merges the group; every thread's partial stores come before the call.
  // Call from every thread; `verdict`: an int of the block's dynamic shared memory (a static
  // __shared__ one cost the decode 20%: docs/perf/attention.md, ninetieth session); `early_mark`:
  // split 0's early_started_mark (unused by the other splits).
  __device__ bool merges_here(int split, unsigned long long tag, int* verdict,
                              unsigned long long early_mark) const {
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = static_cast<int>(threadIdx.x);
      bool merge = false, last_finisher_path = split != 0;
      if (split == 0) {
        bool all_started = early_mark == tag;
        for (int i = lane + 33; i < splits; i += 32) all_started &= load(started + i) == tag;
        if (__all_sync(0xffffffffu, all_started)) {
          for (int i = lane + 1; i < splits; i += 32)
            while (load_acquire(done() + i) != tag) {
            }
          merge = true;
        } else {
          if (lane == 0) store_release(done(), tag), store_release(handoff(), tag);
          last_finisher_path = true;
        }
      } else if (lane == 0) {
        store_release(done() + split, tag);
      }
      if (last_finisher_path) {
        __syncwarp();
        asm volatile("fence.sc.gpu;\n" ::: "memory");
        bool all = load(handoff()) == tag;
        for (int i = lane; i < splits; i += 32) all &= load(done() + i) == tag;
        merge = __all_sync(0xffffffffu, all);
        if (merge) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
      }
      __syncwarp();
      if (lane == 0) *verdict = merge;
    }
    __syncthreads();
    return *verdict != 0;
  }
  // Every word back to 0, by the merging block once its reads are done. Call from every thread.
  __device__ void clear() const {
    for (int i = static_cast<int>(threadIdx.x); i < words(splits); i += blockDim.x)
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(started + i), "l"(0ull)
                   : "memory");
  }

 private:
  __device__ static unsigned long long load(const unsigned long long* w) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(w) : "memory");
    return v;
  }
  __device__ static unsigned long long load_acquire(const unsigned long long* w) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(w) : "memory");
    return v;
  }
  __device__ static void store_release(unsigned long long* w, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;\n" ::"l"(w), "l"(v) : "memory");
  }
};

}  // namespace baracuda::cuda

// Work splitting for the CPU kernels: `for_each_item(items, f)` calls f(i) once for every i in [0, items)
// on torch's OpenMP threads. Each thread owns a contiguous range and walks it from the front, so a thread's
// memory stream stays sequential (the weights of a decode step come from DRAM and the hardware prefetcher
// follows such a stream); a thread that finishes its range takes items from the back of the others'. A fixed
// split would leave the faster core waiting at the join, and this machine's cores run at different speeds
// from moment to moment (their sibling hardware threads are other tenants').
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace skiff_cpu {

// [lo, hi) of one thread's items in one word, so that the owner (lo += 1) and a thief (hi -= 1) agree by CAS.
struct alignas(64) ItemRange {
  std::atomic<uint64_t> bounds;
};

inline uint64_t pack_range(uint32_t lo, uint32_t hi) { return static_cast<uint64_t>(hi) << 32 | lo; }

// Takes one item from the front (owner) or the back (thief) of r; -1 when it is empty.
inline int64_t take_item(ItemRange& r, bool front) {
  uint64_t old = r.bounds.load(std::memory_order_relaxed);
  for (;;) {
    const uint32_t lo = static_cast<uint32_t>(old), hi = static_cast<uint32_t>(old >> 32);
    if (lo >= hi) return -1;
    const uint64_t next = front ? pack_range(lo + 1, hi) : pack_range(lo, hi - 1);
    if (r.bounds.compare_exchange_weak(old, next, std::memory_order_relaxed)) return front ? lo : hi - 1;
  }
}

template <typename F>
void for_each_item(int64_t items, const F& f) {
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), items);
  if (workers <= 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < items; ++i) f(i);
    return;
  }
  std::vector<ItemRange> ranges(workers);
  for (int64_t t = 0; t < workers; ++t)
    ranges[t].bounds.store(pack_range(static_cast<uint32_t>(items * t / workers),
                                      static_cast<uint32_t>(items * (t + 1) / workers)));
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t self = begin; self < end; ++self) {
      for (int64_t i; (i = take_item(ranges[self], true)) >= 0;) f(i);
      for (int64_t k = 1; k < workers; ++k)
        for (int64_t i; (i = take_item(ranges[(self + k) % workers], false)) >= 0;) f(i);
    }
  });
}

}  // namespace skiff_cpu

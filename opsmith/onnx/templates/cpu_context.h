/* ---- opsmith::cpu_context: what a CPU function may take as its last parameter ---- */
/* The one opsmith type a CPU function of an ONNX Runtime op library sees (docs/onnx.md, "CPU
 * functions"). A template of opsmith.onnx (opsmith/onnx/_generate.py fills its placeholders); the
 * library's generated C++ holds this text before the CPU source. */
#ifndef OPSMITH_CPU_CONTEXT_H_
#define OPSMITH_CPU_CONTEXT_H_
#include <stddef.h>
#include <atomic>
#include <exception>
#include <type_traits>

namespace opsmith {
class cpu_context {
 public:
  typedef void (*chunk_fn)(void *data, size_t chunk);
  typedef void (*run_fn)(const void *state, size_t chunks, chunk_fn fn, void *data);

  /* Made by the library for each call; a CPU function only uses it. */
  cpu_context(run_fn run, const void *state) : run_(run), state_(state) {}

  /* Whether parallel_for reaches ORT's intra-op thread pool: ORT 1.@PFV@ and newer have
   * KernelContext_ParallelFor; with an older ORT, parallel_for runs on the calling thread. */
  bool has_thread_pool() const { return run_ != nullptr; }

  /* Calls body(begin, end) on consecutive chunks that cover [0, n) once, on ORT's intra-op
   * threads, several at a time (the session's intra_op_num_threads says how many). Each chunk
   * holds a multiple of 64 items (the last one excepted) and at least `grain` items, so every
   * chunk starts as aligned as the tensor (ORT's CPU tensors are 64-byte aligned); at most 256
   * chunks. With n <= grain, body(0, n) runs here and nothing is handed to the pool. The first
   * exception body throws is rethrown here once every chunk has run or been skipped. */
  template <typename F>
  void parallel_for(long long n, long long grain, F &&body) const {
    if (n <= 0) return;
    long long chunk = grain > 64 ? grain : 64;
    long long least = (n + max_chunks - 1) / max_chunks;
    if (chunk < least) chunk = least;
    chunk = (chunk + 63) / 64 * 64;
    if (run_ == nullptr || chunk >= n) {
      body(0LL, n);
      return;
    }
    struct job {
      typename std::remove_reference<F>::type *body;
      long long n, chunk;
      std::atomic<bool> failed;
      std::exception_ptr error;
    } work{&body, n, chunk, {false}, nullptr};
    run_(state_, (size_t)((n + chunk - 1) / chunk), [](void *data, size_t i) {
      job *w = static_cast<job *>(data);
      if (w->failed.load(std::memory_order_relaxed)) return;
      long long begin = (long long)i * w->chunk;
      long long end = w->n - begin < w->chunk ? w->n : begin + w->chunk;
      try {
        (*w->body)(begin, end);
      } catch (...) {
        if (!w->failed.exchange(true)) w->error = std::current_exception();
      }
    }, &work);
    if (work.error) std::rethrow_exception(work.error);
  }

 private:
  static constexpr long long max_chunks = 256;
  run_fn run_;
  const void *state_;
};
}  // namespace opsmith
#endif  /* OPSMITH_CPU_CONTEXT_H_ */
/* ---- end of opsmith::cpu_context ---- */

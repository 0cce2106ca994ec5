#include "core/bench/bench.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/check.hpp"

namespace baracuda::bench {

std::string_view env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string_view{} : std::string_view(v);
}

int64_t env_positive(const char* name, int64_t fallback) {
  const std::string v(env(name));
  char* end = nullptr;
  const long long n = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
  return n > 0 && end != nullptr && *end == '\0' ? static_cast<int64_t>(n) : fallback;
}

std::vector<std::string> env_list(const char* name) {
  std::vector<std::string> items;
  for (std::string_view rest = env(name); !rest.empty();) {
    const size_t comma = std::min(rest.find(','), rest.size());
    if (comma > 0) items.emplace_back(rest.substr(0, comma));
    rest.remove_prefix(std::min(comma + 1, rest.size()));
  }
  return items;
}

bool env_list_selects(const std::vector<std::string>& list, std::string_view name) {
  return list.empty() || std::find(list.begin(), list.end(), name) != list.end();
}

namespace {

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

std::string commit() {
  const std::string_view c = env("BARACUDA_COMMIT");
  return c.empty() ? "unknown" : std::string(c);
}

// Device-to-device copy of 1 GiB, read + write bytes counted; median of 20.
double measure_copy_gbps(const Stream& s) {
  const size_t bytes = size_t{1} << 30;
  auto a = Buffer::allocate(bytes, s.memory_location());
  auto b = Buffer::allocate(bytes, s.memory_location());
  if (!a.ok() || !b.ok()) return 0;
  if (!fill_bytes(a->data(), a->where(), 0x3C, bytes).ok()) return 0;
  auto cs = static_cast<cudaStream_t>(s.cuda_handle());
  auto t = time_it(
      s,
      [&](int) -> Status {
        return cuda::check(
            "bench", "copy",
            cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, cs));
      },
      1, 20, 3);
  return t.ok() ? 2.0 * bytes / (t->median_ms * 1e-3) / 1e9 : 0;
}

// cuBLASLt bf16 GEMM 8192^3 (f32 accumulate) on random data; median of 10.
double measure_gemm_tflops(const Stream& s) {
  const int64_t n = 8192;
  const size_t bytes = static_cast<size_t>(n * n * 2);
  auto a = Buffer::allocate(bytes, s.memory_location());
  auto b = Buffer::allocate(bytes, s.memory_location());
  auto c = Buffer::allocate(bytes, s.memory_location());
  auto ws = Buffer::allocate(size_t{64} << 20, s.memory_location());
  if (!a.ok() || !b.ok() || !c.ok() || !ws.ok()) return 0;
  std::vector<uint16_t> host(static_cast<size_t>(n * n));
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& h : host) {
    const float f = u(g);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = static_cast<uint16_t>(bits >> 16);
  }
  if (!copy_bytes(a->data(), a->where(), host.data(), Location::host(), bytes).ok() ||
      !copy_bytes(b->data(), b->where(), host.data(), Location::host(), bytes).ok())
    return 0;
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 0;
  cublasLtMatmulDesc_t op;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  size_t ws_bytes = ws->bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof ws_bytes);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
  double tflops = 0;
  if (found) {
    const float alpha = 1.f, beta = 0.f;
    auto cs = static_cast<cudaStream_t>(s.cuda_handle());
    auto t = time_it(
        s,
        [&](int) -> Status {
          auto st = cublasLtMatmul(lt, op, &alpha, a->data(), la, b->data(), lb, &beta, c->data(),
                                   lc, c->data(), lc, &heur.algo, ws->data(), ws_bytes, cs);
          if (st != CUBLAS_STATUS_SUCCESS) return Error::library("bench: gemm", "cublasLt", st);
          return {};
        },
        1, 10, 3);
    if (t.ok()) tflops = 2.0 * n * n * n / (t->median_ms * 1e-3) / 1e12;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return tflops;
}

std::vector<std::pair<std::string, BenchFn>>& bench_table() {
  static std::vector<std::pair<std::string, BenchFn>> t;
  return t;
}

// Median, fastest and slowest of the per-call times of `samples` timings (at least one).
Timing summarize(std::vector<double> ms, int samples) {
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), ms.back(), samples};
}

}  // namespace

std::vector<std::pair<std::string, BenchFn>> registered_benches() {
  return bench_table();
}

bool register_bench(std::string_view family, BenchFn fn) {
  bench_table().emplace_back(std::string(family), fn);
  return true;
}

const Ceilings& ceilings(const Stream& stream) {
  static const Ceilings c = [&] {
    Ceilings r;
    r.copy_gbps = measure_copy_gbps(stream);
    r.gemm_tflops = measure_gemm_tflops(stream);
    return r;
  }();
  return c;
}

Result<Timing> time_it(const Stream& stream, const std::function<Status(int)>& fn, int rotations,
                       int reps, int warmup) {
  auto cs = static_cast<cudaStream_t>(stream.cuda_handle());
  rotations = std::max(rotations, 1);
  for (int i = 0; i < warmup; ++i) BARACUDA_TRY(fn(i % rotations));
  BARACUDA_TRY(cuda::check("bench", "warm-up", cudaStreamSynchronize(cs)));
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * reps));
  for (auto& e : ev) cudaEventCreate(&e);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(ev[2 * i], cs);
    Status st = fn((warmup + i) % rotations);
    cudaEventRecord(ev[2 * i + 1], cs);
    if (!st.ok()) {
      cudaStreamSynchronize(cs);
      for (auto& e : ev) cudaEventDestroy(e);
      return st.error();
    }
  }
  Status sync = cuda::check("bench", "timed runs", cudaStreamSynchronize(cs));
  std::vector<double> ms;
  for (int i = 0; i < reps && sync.ok(); ++i) {
    float t = 0;
    cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]);
    ms.push_back(t);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  if (!sync.ok()) return sync.error();
  return summarize(std::move(ms), reps);
}

std::vector<Result<Timing>> time_interleaved(const Stream& stream,
                                             const std::vector<std::function<Status()>>& fns,
                                             int rounds, int reps) {
  const size_t n = fns.size();
  std::vector<std::vector<double>> ms(n);
  std::vector<Status> failed(n);
  for (int r = 0; r < std::max(rounds, 1); ++r)
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (static_cast<size_t>(r) + k) % n;
      if (!failed[i].ok()) continue;
      auto t = time_it(
          stream, [&](int) { return fns[i](); }, 1, reps, 1);
      if (!t.ok()) {
        failed[i] = t.error();
        continue;
      }
      // The round's median stands for the round (time_it keeps no samples).
      ms[i].push_back(t->median_ms);
    }
  std::vector<Result<Timing>> out;
  for (size_t i = 0; i < n; ++i) {
    if (!failed[i].ok())
      out.emplace_back(failed[i].error());
    else {
      const int samples = static_cast<int>(ms[i].size()) * reps;
      out.emplace_back(summarize(std::move(ms[i]), samples));
    }
  }
  return out;
}

Result<Timing> time_back_to_back(const Stream& stream, const std::function<Status()>& fn, int runs,
                                 int rounds, int warmup) {
  auto cs = static_cast<cudaStream_t>(stream.cuda_handle());
  runs = std::max(runs, 1), rounds = std::max(rounds, 1);
  for (int i = 0; i < warmup; ++i) BARACUDA_TRY(fn());
  BARACUDA_TRY(cuda::check("bench", "warm-up", cudaStreamSynchronize(cs)));
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  std::vector<double> ms;
  Status st;
  for (int r = 0; r < rounds && st.ok(); ++r) {
    cudaEventRecord(start, cs);
    for (int i = 0; i < runs && st.ok(); ++i) st = fn();
    cudaEventRecord(stop, cs);
    const Status sync = cuda::check("bench", "timed runs", cudaStreamSynchronize(cs));
    if (st.ok()) st = sync;
    float t = 0;
    if (st.ok()) cudaEventElapsedTime(&t, start, stop), ms.push_back(double{t} / runs);
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  if (!st.ok()) return st.error();
  return summarize(std::move(ms), rounds);
}

Result<Timing> time_host_enqueue(const Stream& stream, const std::function<Status()>& fn, int runs,
                                 int rounds, int warmup) {
  runs = std::max(runs, 1), rounds = std::max(rounds, 1);
  for (int i = 0; i < warmup; ++i) BARACUDA_TRY(fn());
  BARACUDA_TRY(stream.synchronize());
  std::vector<double> ms;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < runs; ++i) BARACUDA_TRY(fn());
    const auto t1 = std::chrono::steady_clock::now();
    BARACUDA_TRY(stream.synchronize());
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / runs);
  }
  return summarize(std::move(ms), rounds);
}

Result<Buffer> random_buffer(const Stream& stream, DType t, int64_t count, uint64_t seed, double lo,
                             double hi) {
  const int64_t elems = std::max<int64_t>(count, 1);
  const int64_t bits = bits_of(t);
  Result<Buffer> buf =
      Buffer::allocate(static_cast<size_t>((elems * bits + 7) / 8), stream.memory_location());
  if (!buf.ok()) return buf.error();
  const int64_t block = std::min<int64_t>(elems, int64_t{1} << 22);
  std::vector<uint8_t> host(static_cast<size_t>((block * bits + 7) / 8));
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < block; ++i) {
    double v = u(g);
    if (!is_floating(t) && !is_complex(t)) v = std::nearbyint(v);
    store_from_double(host.data(), t, i, v);
  }
  const int64_t total = static_cast<int64_t>(buf->bytes()),
                chunk = static_cast<int64_t>(host.size());
  for (int64_t off = 0; off < total; off += chunk) {
    BARACUDA_TRY(copy_bytes(static_cast<char*>(buf->data()) + off, buf->where(), host.data(),
                            Location::host(), static_cast<size_t>(std::min(chunk, total - off))));
  }
  return buf;
}

int rotations_for(const Stream& stream, int64_t bytes_per_set) {
  const int64_t target = 3 * std::max<int64_t>(stream.caps().l2_bytes, 1);
  if (bytes_per_set <= 0) return 1;
  return static_cast<int>(std::min<int64_t>(64, (target + bytes_per_set - 1) / bytes_per_set));
}

void emit(const Stream& stream, const Row& r) {
  const Ceilings& c = ceilings(stream);
  const double s = r.ms * 1e-3;
  const double gbps = s > 0 ? r.bytes / s / 1e9 : 0;
  const double tflops = s > 0 ? r.flops / s / 1e12 : 0;
  // The roofline: the time the slower of the two ceilings allows, over the time measured.
  const double floor_s = std::max(c.copy_gbps > 0 ? r.bytes / (c.copy_gbps * 1e9) : 0.0,
                                  c.gemm_tflops > 0 ? r.flops / (c.gemm_tflops * 1e12) : 0.0);
  const double pct = s > 0 ? 100.0 * floor_s / s : 0;
  std::printf(
      "{\"family\": \"%s\", \"op\": \"%s\", \"name\": \"%s\", \"dtype\": \"%s\", \"kernel\": "
      "\"%s\", \"ms\": %.5f, \"gbps\": %.1f, \"tflops\": %.2f, \"pct_roofline\": %.1f, "
      "\"copy_gbps\": %.1f, \"gemm_tflops\": %.1f, \"device\": \"%s\", \"commit\": \"%s\", "
      "\"date\": \"%s\", \"note\": \"%s\"}\n",
      r.family.c_str(), r.op.c_str(), r.name.c_str(), r.dtype.c_str(), r.kernel.c_str(), r.ms, gbps,
      tflops, pct, c.copy_gbps, c.gemm_tflops, json_escape(stream.caps().name).c_str(),
      commit().c_str(), today().c_str(), json_escape(r.note).c_str());
  std::fflush(stdout);
}

void emit_error(const std::string& family, const std::string& op, const std::string& name,
                const Error& e) {
  std::printf("{\"family\": \"%s\", \"op\": \"%s\", \"name\": \"%s\", \"error\": \"%s\"}\n",
              family.c_str(), op.c_str(), name.c_str(), json_escape(e.to_string()).c_str());
  std::fflush(stdout);
}

}  // namespace baracuda::bench

// One process, one context, THREADS threads with a stream each, every thread serving mps-bench's
// `infer` request (4 KiB in from pinned memory, 12 dependent saxpy kernels of 4 x 256 threads,
// 4 KiB out, a stream synchronise) REQUESTS times, either launched command by command (`plain`)
// or as one graph captured from the same commands (`graph`): what a server that owns one context
// for many clients gets from the driver when its clients launch graphs.
//   nvcc -O2 -o threads threads.cu -lpthread && ./threads plain|graph THREADS [REQUESTS]
// Prints one line: mode, threads, requests/s over all threads, p50 and p99 of a request in us.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,              \
                   cudaGetErrorString(e_));                                       \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__global__ void saxpy(float a, const float *x, float *y, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

constexpr int kChain = 12;
constexpr size_t kBytes = 4096;
constexpr unsigned long long kN = kBytes / sizeof(float);

static void issue(cudaStream_t s, float *host_in, float *host_out, float *x, float *y) {
  CHECK(cudaMemcpyAsync(x, host_in, kBytes, cudaMemcpyHostToDevice, s));
  for (int k = 0; k < kChain; k++) saxpy<<<4, 256, 0, s>>>(1.0f, x, y, kN);
  CHECK(cudaMemcpyAsync(host_out, y, kBytes, cudaMemcpyDeviceToHost, s));
}

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s plain|graph THREADS [REQUESTS]\n", argv[0]);
    return 2;
  }
  const bool graph = std::strcmp(argv[1], "graph") == 0;
  const int threads = std::atoi(argv[2]);
  const int requests = argc > 3 ? std::atoi(argv[3]) : 5000;
  CHECK(cudaFree(nullptr));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::vector<double>> lat(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      cudaStream_t s;
      CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      float *hin, *hout, *x, *y;
      CHECK(cudaMallocHost(&hin, kBytes));
      CHECK(cudaMallocHost(&hout, kBytes));
      CHECK(cudaMalloc(&x, kBytes));
      CHECK(cudaMalloc(&y, kBytes));
      for (unsigned long long i = 0; i < kN; i++) hin[i] = float(i % 7);
      CHECK(cudaMemsetAsync(y, 0, kBytes, s));
      issue(s, hin, hout, x, y);
      CHECK(cudaStreamSynchronize(s));
      cudaGraphExec_t exec = nullptr;
      if (graph) {
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        issue(s, hin, hout, x, y);
        CHECK(cudaStreamEndCapture(s, &g));
        CHECK(cudaGraphInstantiate(&exec, g, 0));
        CHECK(cudaGraphDestroy(g));
      }
      lat[t].reserve(requests);
      ready++;
      while (!go.load()) std::this_thread::yield();
      for (int r = 0; r < requests; r++) {
        auto a = std::chrono::steady_clock::now();
        if (graph) CHECK(cudaGraphLaunch(exec, s));
        else issue(s, hin, hout, x, y);
        CHECK(cudaStreamSynchronize(s));
        lat[t].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a)
                .count());
      }
      // y gained x on each kernel of every request (the warm-up's included).
      const float want = float((requests + 1) * kChain);
      for (unsigned long long i = 0; i < kN; i++) {
        if (hout[i] != hin[i] * want) {
          std::fprintf(stderr, "thread %d: output %llu is %f, not %f\n", t, i, hout[i],
                       hin[i] * want);
          std::exit(1);
        }
      }
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  auto start = std::chrono::steady_clock::now();
  go = true;
  for (auto &th : pool) th.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (auto &v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  std::printf("%s threads=%d req/s=%.0f p50=%.1fus p99=%.1fus\n", argv[1], threads,
              all.size() / secs, all[all.size() / 2], all[all.size() * 99 / 100]);
  return 0;
}

// Where a round trip's time goes: one launch of a kernel that does nothing and a wait for it,
// natively in four ways, alternated over rounds, 20,000 samples each:
//   sync       cuLaunchKernel, cuStreamSynchronize (what mps-bench's native rtt does)
//   write      cuLaunchKernel, cuStreamWriteValue64 of the sample's number into pinned host
//              memory, the thread spinning on that word (how an mps server reports progress)
//   hop        as write, but a second thread launches and writes, told by a word in host
//              memory that the first thread sets and then spins on the progress word (a
//              client and the server thread serving its ring)
//   hop2       as hop, with the launch and the progress write asked for by two words set one
//              after the other, each seen and acted on by the server thread on its own (the
//              launch command and the separate synchronise mark of mps's protocol)
// As run, hop2 is flawed and its figures are not used: the server thread may see the mark's
// word before the launch's and write the progress before launching, so a sample can end before
// its kernel ran (hence its 4.9 us, below a kernel's round trip).
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void spin(unsigned long long ns, unsigned long long *counter) {
    if (ns == 1) atomicAdd(counter, 1ull);
}

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("%s failed %d\n", #x, r_); exit(1); } } while (0)

static double now_us() {
    return std::chrono::duration<double, std::micro>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Shared {
    alignas(64) std::atomic<unsigned long long> launch{0};
    alignas(64) std::atomic<unsigned long long> mark{0};
    alignas(64) std::atomic<unsigned long long> both{0};
    alignas(64) std::atomic<bool> stop{false};
};

int main() {
    const int n = 20000, rounds = 5;
    cudaFree(0);
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    CUfunction f;
    cudaGetFuncBySymbol((cudaFunction_t *)&f, (const void *)spin);
    unsigned long long *counter;
    cudaMalloc(&counter, 8);
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    volatile unsigned long long *word;
    CK(cuMemHostAlloc((void **)&word, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    *word = 0;
    CUdeviceptr dword;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    unsigned long long ns = 0;
    void *params[] = {&ns, &counter};
    auto launch = [&] { CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr)); };
    auto write = [&](unsigned long long v) { CK(cuStreamWriteValue64(s, dword, v, 0)); };
    auto await = [&](unsigned long long v) { while (*word < v) {} };

    Shared sh;
    unsigned long long seq = 0;
    // The "server": a launch and its progress write for each new value of `both` (hop); a
    // launch for each new value of `launch` and a progress write for each of `mark` (hop2).
    std::thread server([&] {
        CK(cuCtxSetCurrent(ctx));
        unsigned long long done_launch = 0, done_mark = 0, done_both = 0;
        while (!sh.stop.load(std::memory_order_relaxed)) {
            unsigned long long b = sh.both.load(std::memory_order_acquire);
            if (b > done_both) { launch(); write(b); done_both = b; }
            unsigned long long l = sh.launch.load(std::memory_order_acquire);
            if (l > done_launch) { launch(); done_launch = l; }
            unsigned long long m = sh.mark.load(std::memory_order_acquire);
            if (m > done_mark) { write(m); done_mark = m; }
        }
    });

    const char *names[] = {"sync", "write", "hop", "hop2"};
    std::vector<double> med[4], p99[4];
    for (int round = 0; round < rounds; round++) {
        for (int m = 0; m < 4; m++) {
            std::vector<double> t(n);
            for (int i = -200; i < n; i++) {
                double t0 = now_us();
                ++seq;
                switch (m) {
                case 0: launch(); CK(cuStreamSynchronize(s)); break;
                case 1: launch(); write(seq); await(seq); break;
                case 2: sh.both.store(seq, std::memory_order_release); await(seq); break;
                case 3:
                    sh.launch.store(seq, std::memory_order_release);
                    sh.mark.store(seq, std::memory_order_release);
                    await(seq);
                    break;
                }
                if (i >= 0) t[i] = now_us() - t0;
            }
            std::sort(t.begin(), t.end());
            med[m].push_back(t[n / 2]);
            p99[m].push_back(t[n * 99 / 100]);
        }
    }
    sh.stop = true;
    server.join();
    printf("| way | median us (rounds) | p99 us (rounds) | median / sync |\n| --- | --- | --- | --- |\n");
    for (int m = 0; m < 4; m++) {
        std::vector<double> a = med[m], b = p99[m], r;
        for (int k = 0; k < rounds; k++) r.push_back(med[m][k] / med[0][k]);
        std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end()); std::sort(r.begin(), r.end());
        printf("| %s | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2fx (%.2f-%.2f) |\n", names[m],
               a[rounds / 2], a[0], a[rounds - 1], b[rounds / 2], b[0], b[rounds - 1],
               r[rounds / 2], r[0], r[rounds - 1]);
    }
    return 0;
}

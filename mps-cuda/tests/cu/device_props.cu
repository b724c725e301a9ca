// cudaGetDeviceCount and cudaGetDeviceProperties: what a program sees of the device.
#include "check.h"

int main() {
    int count = 0, dev = -1;
    CHECK(cudaGetDeviceCount(&count));
    CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    EXPECT(sms == p.multiProcessorCount);
    printf("devices %d, current %d\n", count, dev);
    printf("name %s\n", p.name);
    printf("compute capability %d.%d, %d SMs\n", p.major, p.minor, p.multiProcessorCount);
    printf("warp %d, threads per block %d, block %dx%dx%d, grid %dx%dx%d\n", p.warpSize,
           p.maxThreadsPerBlock, p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2],
           p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
    printf("shared per block %zu, registers per block %d\n", p.sharedMemPerBlock, p.regsPerBlock);
    printf("memory %zu MiB\n", p.totalGlobalMem >> 20);
    // Facts of the GPU itself (CUDA 13 asks for the clock by attribute).
    int clock = 0, l2 = 0, bus = 0;
    CHECK(cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, 0));
    CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    CHECK(cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, 0));
    EXPECT(clock > 0 && l2 > 0 && bus > 0);
    printf("clock %d kHz, L2 %d bytes, memory bus %d bits\n", clock, l2, bus);
    printf("device_props: done\n");
    return 0;
}

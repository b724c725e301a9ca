// Stream capture with the runtime API: a copy in, a memset, two kernels and a copy out captured
// once (cudaStreamBeginCapture), instantiated (cudaGraphInstantiate) and launched
// (cudaGraphLaunch) with new input each time, every output checked; the capture status and ID
// while capturing, the graph's node count, and CUDA's rules: no capture on the legacy stream,
// no end where nothing captures, no synchronising a capturing stream, no allocation during a
// global capture unless the thread is in relaxed mode.
#include "check.h"

int main() {
    const uint64_t n = 1 << 12;
    const size_t bytes = n * sizeof(float);
    float *hin, *hout, *dx, *dy;
    CHECK(cudaMallocHost(&hin, bytes));
    CHECK(cudaMallocHost(&hout, bytes));
    CHECK(cudaMalloc(&dx, bytes));
    CHECK(cudaMalloc(&dy, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (uint64_t i = 0; i < n; i++) hout[i] = -1.0f;

    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
    EXPECT(st == cudaStreamCaptureStatusNone);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    unsigned long long id = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id));
    EXPECT(st == cudaStreamCaptureStatusActive && id != 0);
    CHECK(cudaMemcpyAsync(dx, hin, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemsetAsync(dy, 0, bytes, s));
    saxpy_f32<<<16, 256, 0, s>>>(2.0f, dx, dy, n);
    CHECK(cudaGetLastError());
    add_f32<<<16, 256, 0, s>>>(dy, dx, dy, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(hout, dy, bytes, cudaMemcpyDeviceToHost, s));
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaStreamIsCapturing(s, &st));
    EXPECT(st == cudaStreamCaptureStatusNone);
    // The capture ran nothing.
    CHECK(cudaStreamSynchronize(s));
    EXPECT(hout[0] == -1.0f && hout[n - 1] == -1.0f);

    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    printf("captured nodes: %zu\n", nodes);

    // Instantiated plainly, and with the flags PyTorch's CUDAGraph gives.
    cudaGraphExec_t exec, flagged;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphInstantiateWithFlags(
        &flagged, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority));
    CHECK(cudaGraphDestroy(graph));
    const int rounds = 4;
    for (int round = 0; round < rounds; round++) {
        for (uint64_t i = 0; i < n; i++) hin[i] = (float)(i + 1000 * round);
        CHECK(cudaGraphLaunch(round % 2 ? flagged : exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (uint64_t i = 0; i < n; i++) EXPECT(hout[i] == 3.0f * hin[i]);
    }
    printf("%d graph launches: y[%llu] = %.1f\n", rounds, (unsigned long long)n - 1, hout[n - 1]);

    cudaError_t r = cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal);
    printf("capture on the legacy stream: %s\n", cudaGetErrorName(r));
    r = cudaStreamEndCapture(s, &graph);
    printf("end without a capture: %s\n", cudaGetErrorName(r));

    // Synchronising a capturing stream is refused and invalidates the capture.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    r = cudaStreamSynchronize(s);
    printf("synchronise while capturing: %s\n", cudaGetErrorName(r));
    r = cudaStreamEndCapture(s, &graph);
    printf("end after it: %s, graph %s\n", cudaGetErrorName(r), graph ? "made" : "none");

    // Allocating during a global capture is refused (and invalidates it) unless the thread is
    // in relaxed mode.
    float *extra;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    r = cudaMalloc(&extra, 256);
    printf("cudaMalloc during a global capture: %s\n", cudaGetErrorName(r));
    r = cudaStreamEndCapture(s, &graph);
    printf("end after it: %s\n", cudaGetErrorName(r));
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(cudaMalloc(&extra, 256));
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == cudaStreamCaptureModeRelaxed);
    CHECK(cudaMemsetAsync(extra, 0, 256, s));
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaFree(extra));
    printf("cudaMalloc in relaxed mode during a capture: cudaSuccess\n");

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphExecDestroy(flagged));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFreeHost(hin));
    CHECK(cudaFreeHost(hout));
    printf("graph: done\n");
    return 0;
}

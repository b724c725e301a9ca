// One context, N threads, a stream and a graph each (a copy in, 12 saxpy kernels, a copy out,
// as mps-bench's infer-graph), requests per second over all threads, by how each request's
// completion is seen:
//   sync   cuGraphLaunch, cuStreamSynchronize
//   write  cuGraphLaunch, cuStreamWriteValue64 into a mapped host word, spin on the word
//   node   the graph ends in a write-value node whose value cuGraphExecBatchMemOpNodeSetParams
//          sets before each launch; spin on the word
//   plain-sync, plain-write  the request's 14 operations launched one by one instead of the
//          graph, then cuStreamSynchronize, or a stream write and a spin, as above
//   event, plain-event  cuEventRecord after the request (timing off), spin on cuEventQuery
//   nobar, plain-nobar  the stream write with CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER (refused
//          by the v2 API that CUDA 13 has)
//   kernel  after the graph, a one-thread kernel that fences and stores the word
// Usage: graphmark SECONDS N...; with ONLY=K just variant K (0 to 8), and with START_AT=T (a
// CLOCK_REALTIME second) the timed loop starts at T, so that processes started apart begin
// together.
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)
#define DK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorName(r, &s); fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s); exit(1); } } while (0)

__global__ void publish(volatile unsigned long long *word, unsigned long long seq) {
  __threadfence_system();
  *word = seq;
}

__global__ void saxpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

enum { SYNC, WRITE, NODE, PSYNC, PWRITE, EVENT, PEVENT, NOBAR, PNOBAR, KERNEL, VARIANTS };
static const char *names[] = {"sync", "write", "node", "plain-sync", "plain-write", "event",
                              "plain-event", "nobar", "plain-nobar", "kernel"};
static int plain(int v) { return v == PSYNC || v == PWRITE || v == PEVENT || v == PNOBAR; }
static int variant, nthreads; static double seconds;
static pthread_barrier_t bar;
static CUcontext ctx;
static long counts[64];
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void *run(void *arg) {
  long t = (long)arg;
  DK(cuCtxSetCurrent(ctx));
  const int n = 1024; size_t bytes = n * 4;
  float *x, *y, *hin, *hout; volatile unsigned long long *word; CUdeviceptr dword;
  CK(cudaMalloc(&x, bytes)); CK(cudaMalloc(&y, bytes));
  CK(cudaHostAlloc(&hin, bytes, 0)); CK(cudaHostAlloc(&hout, bytes, 0));
  CK(cudaHostAlloc((void **)&word, 8, cudaHostAllocMapped)); *word = 0;
  CK(cudaHostGetDevicePointer((void **)&dword, (void *)word, 0));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemcpyAsync(x, hin, bytes, cudaMemcpyHostToDevice, s));
  for (int k = 0; k < 12; k++) saxpy<<<4, 256, 0, s>>>(1.0f, x, y, n);
  CK(cudaMemcpyAsync(hout, y, bytes, cudaMemcpyDeviceToHost, s));
  // Captured, a stream write becomes a batch memory-operation node.
  if (variant == NODE) DK(cuStreamWriteValue64((CUstream)s, dword, 0, 0));
  CK(cudaStreamEndCapture(s, &g));
  CUgraphNode node = 0;
  CUstreamBatchMemOpParams op; memset(&op, 0, sizeof op);
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  op.writeValue.address = dword; op.writeValue.value64 = 0;
  CUDA_BATCH_MEM_OP_NODE_PARAMS p; memset(&p, 0, sizeof p);
  p.ctx = ctx; p.count = 1; p.paramArray = &op;
  if (variant == NODE) {
    size_t nn = 0; DK(cuGraphGetNodes((CUgraph)g, NULL, &nn));
    CUgraphNode *all = (CUgraphNode *)malloc(nn * sizeof *all); DK(cuGraphGetNodes((CUgraph)g, all, &nn));
    for (size_t i = 0; i < nn; i++) { CUgraphNodeType ty; DK(cuGraphNodeGetType(all[i], &ty)); if (ty == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) node = all[i]; }
    if (!node) { fprintf(stderr, "no memop node in the capture\n"); exit(1); }
  }
  CUevent ev; DK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  cudaGraphExec_t ge; CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
  pthread_barrier_wait(&bar);
  const char *at = getenv("START_AT");
  if (at) { double t0 = atof(at); struct timespec ts; do { clock_gettime(CLOCK_REALTIME, &ts); } while (ts.tv_sec + ts.tv_nsec * 1e-9 < t0); }
  double end = now() + seconds; long c = 0; unsigned long long seq = 0;
  while (now() < end) {
    for (int r = 0; r < 64; r++) {
      seq++;
      if (variant == NODE) { op.writeValue.value64 = seq; DK(cuGraphExecBatchMemOpNodeSetParams((CUgraphExec)ge, node, &p)); }
      if (plain(variant)) {
        CK(cudaMemcpyAsync(x, hin, bytes, cudaMemcpyHostToDevice, s));
        for (int k = 0; k < 12; k++) saxpy<<<4, 256, 0, s>>>(1.0f, x, y, n);
        CK(cudaMemcpyAsync(hout, y, bytes, cudaMemcpyDeviceToHost, s));
      } else {
        DK(cuGraphLaunch((CUgraphExec)ge, (CUstream)s));
      }
      if (variant == SYNC || variant == PSYNC) { DK(cuStreamSynchronize((CUstream)s)); continue; }
      if (variant == KERNEL) publish<<<1, 1, 0, s>>>((volatile unsigned long long *)dword, seq);
      if (variant == EVENT || variant == PEVENT) {
        DK(cuEventRecord(ev, (CUstream)s));
        while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY) __builtin_ia32_pause();
        continue;
      }
      if (variant == WRITE || variant == PWRITE) DK(cuStreamWriteValue64((CUstream)s, dword, seq, 0));
      if (variant == NOBAR || variant == PNOBAR)
        DK(cuStreamWriteValue64((CUstream)s, dword, seq, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
      while (*word < seq) __builtin_ia32_pause();
    }
    c += 64;
  }
  counts[t] = c;
  CK(cudaStreamSynchronize(s));
  return NULL;
}

int main(int argc, char **argv) {
  seconds = atof(argv[1]);
  CK(cudaFree(0)); DK(cuCtxGetCurrent(&ctx));
  for (int a = 2; a < argc; a++) for (variant = 0; variant < VARIANTS; variant++) {
    if (getenv("ONLY") && atoi(getenv("ONLY")) != variant) continue;
    nthreads = atoi(argv[a]);
    pthread_barrier_init(&bar, NULL, nthreads);
    pthread_t th[64];
    for (long t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, run, (void *)t);
    long sum = 0; for (int t = 0; t < nthreads; t++) { pthread_join(th[t], NULL); sum += counts[t]; }
    printf("N=%d %s %.1fk requests/s\n", nthreads, names[variant], sum / seconds / 1000);
    fflush(stdout);
    pthread_barrier_destroy(&bar);
  }
  return 0;
}

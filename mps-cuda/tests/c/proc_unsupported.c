/* What cudart does first: dlopen("libcuda.so.1") and take every function from
 * cuGetProcAddress by (name, version, flags). Then: an unsupported function and a table mps
 * does not serve (both with MPS_ONLY=1), the runtime's export table, the error strings.
 * Usage: proc_unsupported <test_kernels.ptx> */
#include <dlfcn.h>
#include <string.h>

#include "cuda_api.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, unsigned long long,
                                CUdriverProcAddressQueryResult *);
typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    ASSERT(lib != NULL, "dlopen: %s", dlerror());
    if (!lib) return finish("proc_unsupported");
    get_proc_fn get_proc;
    *(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
    ASSERT(get_proc != NULL, "no cuGetProcAddress_v2");

    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 99;
    CHECK(get_proc("cuInit", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    ASSERT(st == CU_GET_PROC_ADDRESS_SUCCESS && fn != NULL, "cuInit: %d", st);
    /* Which address a name is answered with is the library's choice (NVIDIA's driver may hand
     * out internal entry points); mps hands out its exported functions. */
    if (mps_only()) ASSERT(fn == dlsym(lib, "cuInit"), "cuInit is not the exported cuInit");
    init_fn init;
    *(void **)&init = fn;
    CHECK(init(0));

    /* A version picks the ABI: cuMemAlloc at 3.2 and later is cuMemAlloc_v2. mps serves no ABI
     * older than CUDA 3.2's (NVIDIA's driver may still serve cuMemAlloc's first one). */
    CHECK(get_proc("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    if (mps_only()) {
        ASSERT(fn == dlsym(lib, "cuMemAlloc_v2"), "cuMemAlloc at 13000 is not cuMemAlloc_v2");
        CHECK(get_proc("cuMemAlloc", &fn, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
        ASSERT(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && fn == NULL, "status %d", st);
    }
    /* A name not served is no error: NULL, and the reason in the status. */
    fn = &st; /* not NULL: the call must clear it */
    CHECK(get_proc("cuNoSuchFunction", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    ASSERT(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && fn == NULL, "status %d", st);
    /* The per-thread default-stream variant, where there is one. */
    CHECK(get_proc("cuLaunchKernel", &fn, 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                   &st));
    ASSERT(fn != NULL, "no per-thread cuLaunchKernel");
    if (mps_only())
        ASSERT(fn == dlsym(lib, "cuLaunchKernel_ptsz"), "not the exported cuLaunchKernel_ptsz");

    CUcontext ctx;
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CHECK(get_proc("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    alloc_fn alloc;
    *(void **)&alloc = fn;
    CUdeviceptr p = 0;
    CHECK(alloc(&p, 1024));
    ASSERT(p != 0, "cuMemAlloc through cuGetProcAddress gave 0");

    /* Unsupported through mps: refused cleanly, every time (said once on stderr). */
    if (mps_only()) {
        EXPECT(cuGraphDebugDotPrint(NULL, "/dev/null", 0), CUDA_ERROR_NOT_SUPPORTED);
        EXPECT(cuGraphDebugDotPrint(NULL, "/dev/null", 0), CUDA_ERROR_NOT_SUPPORTED);
    }
    CHECK(get_proc("cuGraphDebugDotPrint", &fn, 11030, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    if (mps_only())
        ASSERT(fn == dlsym(lib, "cuGraphDebugDotPrint"), "cuGraphDebugDotPrint is not its stub");
    /* The runtime's interface table is served (its first word is its size in bytes, as in
       NVIDIA's driver, and its address is the same every time); NVML's 69a28e9f table is
       not. */
    const void *table = NULL, *again = NULL;
    CUuuid id;
    memcpy(id.bytes, "\x6b\xd5\xfb\x6c\x5b\xf4\xe7\x4a\x89\x87\xd9\x39\x12\xfd\x9d\xf9", 16);
    CHECK(cuGetExportTable(&table, &id));
    CHECK(cuGetExportTable(&again, &id));
    ASSERT(table && *(const size_t *)table == 104 && again == table, "cudart interface table %p",
           table);
    if (mps_only()) {
        memcpy(id.bytes, "\x69\xa2\x8e\x9f\x24\x49\x8b\x47\xb0\x30\xc5\xda\x33\x0e\xa4\xe9",
               16);
        table = (const void *)1;
        EXPECT(cuGetExportTable(&table, &id), CUDA_ERROR_NOT_SUPPORTED);
        ASSERT(table == NULL, "a refused export table is not NULL");
    }

    const char *s = NULL;
    CHECK(cuGetErrorName(CUDA_ERROR_NOT_SUPPORTED, &s));
    ASSERT(s && strcmp(s, "CUDA_ERROR_NOT_SUPPORTED") == 0, "name %s", s ? s : "NULL");
    CHECK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    ASSERT(s && strcmp(s, "out of memory") == 0, "string %s", s ? s : "NULL");
    EXPECT(cuGetErrorName(12345, &s), CUDA_ERROR_INVALID_VALUE);
    ASSERT(s == NULL, "a name for an unknown result");

    CHECK(cuMemFree_v2(p));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("proc_unsupported");
}

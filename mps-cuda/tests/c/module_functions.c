/* A module's and a library's kernels listed (cuModuleGetFunctionCount, cuModuleEnumerateFunctions,
 * cuLibraryGetKernelCount, cuLibraryEnumerateKernels) and named (cuFuncGetName, cuKernelGetName):
 * each listed handle is the one cuModuleGetFunction gives for its name, and launches. Then the
 * walk over a module's functions that cuFFT asks of the tools-module export table (6e163fbe, [7]):
 * the visitor is called with (user, function, name) for each function, and [7] returns how
 * many it visited, as NVIDIA's driver does (whose further words differ from call to call: mps
 * passes 0, 0 and the module, as the driver did for cuFFT's plans; checked with MPS_ONLY=1).
 * Usage: module_functions <test_kernels.ptx> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

/* The kernels of test_kernels.ptx. */
static const char *const KERNELS[] = {"fill_u32",   "add_f32",     "saxpy_f32", "spin_ns",
                                      "fault_write", "affine_f32", "sum_params"};
#define NKERNELS (sizeof KERNELS / sizeof KERNELS[0])

static int known(const char *name) {
    for (unsigned i = 0; i < NKERNELS; i++)
        if (strcmp(name, KERNELS[i]) == 0) return 1;
    return 0;
}

struct walk {
    CUfunction want_fill;
    int visits;
    int fill_seen;
    CUmodule module;
    int module_ok;
};

typedef unsigned long long (*visitor)(void *, CUfunction, const char *, size_t, size_t, CUmodule);
typedef unsigned (*walk_fn)(CUcontext, CUmodule, visitor, void *, CUmodule, void *);

static unsigned long long visit(void *user, CUfunction f, const char *name, size_t a, size_t b,
                                CUmodule m) {
    struct walk *w = user;
    if (w->visits++ == 0 && getenv("WALK_VERBOSE") != NULL)
        printf("the walk's first visit: %s, then %#zx %#zx %p (module %p)\n", name, a, b, (void *)m,
               (void *)w->module);
    if (a == 0 && b == 0 && m == w->module) w->module_ok++;
    if (strcmp(name, "fill_u32") == 0 && f == w->want_fill) w->fill_seen++;
    return 0;
}

int main(int argc, char **argv) {
    ASSERT(argc == 2, "usage: module_functions <test_kernels.ptx>");
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));

    unsigned count = 0;
    CHECK(cuModuleGetFunctionCount(&count, mod));
    ASSERT(count == NKERNELS, "the module has %u functions, expected %u", count, (unsigned)NKERNELS);
    CUfunction fs[16] = {0};
    CHECK(cuModuleEnumerateFunctions(fs, count, mod));
    int named = 0;
    for (unsigned i = 0; i < count; i++) {
        const char *name = NULL;
        CHECK(cuFuncGetName(&name, fs[i]));
        ASSERT(name != NULL && known(name), "function %u is named %s", i, name ? name : "NULL");
        CUfunction by_name;
        CHECK(cuModuleGetFunction(&by_name, mod, name));
        ASSERT(by_name == fs[i], "%s listed as %p, looked up as %p", name, (void *)fs[i],
               (void *)by_name);
        named++;
    }
    ASSERT(named == (int)NKERNELS, "named %d functions", named);
    /* Room for fewer: that many are written, the rest left as they were. */
    CUfunction two[3] = {0, 0, (CUfunction)0x1};
    CHECK(cuModuleEnumerateFunctions(two, 2, mod));
    ASSERT(two[0] == fs[0] && two[1] == fs[1] && two[2] == (CUfunction)0x1,
           "two of the functions listed into room for two");

    /* A listed function launches: fill 256 words with 7. */
    CUfunction fill;
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
    CUdeviceptr buf;
    CHECK(cuMemAlloc_v2(&buf, 256 * 4));
    unsigned value = 7;
    unsigned long long n = 256;
    void *args[] = {&buf, &value, &n};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    unsigned host[256];
    CHECK(cuMemcpyDtoH_v2(host, buf, sizeof host));
    ASSERT(host[0] == 7 && host[255] == 7, "fill_u32 wrote %u and %u", host[0], host[255]);

    /* A library's kernels. */
    CUlibrary lib;
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernelCount(&count, lib));
    ASSERT(count == NKERNELS, "the library has %u kernels", count);
    CUkernel ks[16] = {0};
    CHECK(cuLibraryEnumerateKernels(ks, count, lib));
    for (unsigned i = 0; i < count; i++) {
        const char *name = NULL;
        CHECK(cuKernelGetName(&name, ks[i]));
        CUkernel by_name;
        CHECK(cuLibraryGetKernel(&by_name, lib, name));
        ASSERT(by_name == ks[i], "kernel %s listed and looked up differ", name);
    }
    EXPECT(cuModuleGetFunctionCount(&count, (CUmodule)lib), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuModuleGetFunctionCount(NULL, mod), CUDA_ERROR_INVALID_VALUE);

    /* The tools-module walk. */
    CUuuid id;
    const char *hex = "6e163fbeb958444d835ce182aff1991e";
    for (int i = 0; i < 16; i++) {
        unsigned byte = 0;
        sscanf(hex + 2 * i, "%2x", &byte);
        id.bytes[i] = (char)byte;
    }
    const void *const *table = NULL;
    CHECK(cuGetExportTable((const void **)&table, &id));
    ASSERT(table != NULL && ((const size_t *)table)[0] == 99 * 8, "tools-module table layout");
    walk_fn walk_functions;
    *(const void **)&walk_functions = table[7];
    struct walk w = {fill, 0, 0, mod, 0};
    unsigned visited = walk_functions(ctx, mod, visit, &w, mod, NULL);
    ASSERT(visited == NKERNELS && w.visits == (int)NKERNELS && w.fill_seen == 1,
           "the walk returned %u and visited %d functions (fill_u32 %d times)", visited, w.visits,
           w.fill_seen);
    if (mps_only())
        ASSERT(w.module_ok == (int)NKERNELS, "the visitor was given 0, 0 and the module %d times",
               w.module_ok);

    CHECK(cuMemFree_v2(buf));
    CHECK(cuLibraryUnload(lib));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("module_functions");
}

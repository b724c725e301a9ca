/* A tiled TMA descriptor (cuTensorMapEncodeTiled) of a device allocation: a valid one encodes,
 * and what CUDA documents as invalid is CUDA_ERROR_INVALID_VALUE: a rank of 0 or 6, a global
 * address not aligned to 16 bytes, a stride not a multiple of 16, a box dimension past 256, an
 * element stride of 0. Through mps (MPS_ONLY=1) also: a tensor that is not, or not wholly, in
 * the program's memory. cuTensorMapReplaceAddress gives a descriptor another allocation, not one
 * misaligned (nor, through mps, one outside the program's memory). Needs compute capability 9.0
 * natively. Usage: tensor_map */
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

/* A float matrix of ROWS rows of COLS elements, each row STRIDE bytes apart. */
#define ROWS 32ull
#define COLS 64ull
#define STRIDE 256ull
#define BYTES (ROWS * STRIDE)

struct tiled {
    unsigned rank;
    unsigned long long address;
    unsigned long long dims[5];
    unsigned long long strides[4];
    unsigned box[5];
    unsigned element_strides[5];
};

static struct tiled matrix(CUdeviceptr base) {
    struct tiled t = {2, base, {COLS, ROWS}, {STRIDE}, {32, 8}, {1, 1}};
    return t;
}

static CUresult encode(CUtensorMap *map, const struct tiled *t) {
    return cuTensorMapEncodeTiled(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, t->rank,
                                  (void *)(uintptr_t)t->address, t->dims, t->strides, t->box,
                                  t->element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

int main(void) {
    CUcontext ctx;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    CUdeviceptr buf;
    CHECK(cuMemAlloc_v2(&buf, BYTES));

    CUtensorMap map, again;
    memset(&map, 0, sizeof map);
    struct tiled t = matrix(buf);
    CHECK(encode(&map, &t));
    static const CUtensorMap zero;
    ASSERT(memcmp(&map, &zero, sizeof map) != 0, "the descriptor was written");
    CHECK(encode(&again, &t));

    for (unsigned rank = 0; rank <= 6; rank += 6) {
        t = matrix(buf);
        t.rank = rank;
        EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);
    }
    t = matrix(buf);
    t.address += 8;
    EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);
    t = matrix(buf);
    t.strides[0] = STRIDE - 8;
    EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);
    t = matrix(buf);
    t.box[1] = 257;
    EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);
    t = matrix(buf);
    t.element_strides[0] = 0;
    EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);

    if (mps_only()) {
        /* The driver does not look at the memory; mps encodes only the program's own. */
        t = matrix(buf);
        t.dims[1] = ROWS + 1;
        EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);
        t = matrix(buf);
        t.address = buf + (1ull << 40);
        EXPECT(encode(&map, &t), CUDA_ERROR_INVALID_VALUE);
        /* A descriptor out of its 64-byte alignment. */
        char room[sizeof(CUtensorMap) + 128];
        t = matrix(buf);
        EXPECT(encode((CUtensorMap *)(void *)(room + 8 - ((uintptr_t)room % 64) + 64), &t),
               CUDA_ERROR_INVALID_VALUE);
    }

    /* The descriptor given another matrix's address. */
    CUdeviceptr other;
    CHECK(cuMemAlloc_v2(&other, BYTES));
    t = matrix(buf);
    CHECK(encode(&map, &t));
    CHECK(cuTensorMapReplaceAddress(&map, (void *)(uintptr_t)other));
    EXPECT(cuTensorMapReplaceAddress(&map, (void *)(uintptr_t)(other + 8)),
           CUDA_ERROR_INVALID_VALUE);
    if (mps_only()) {
        ASSERT(memcmp(&map, &again, sizeof map) != 0, "the address was replaced");
        EXPECT(cuTensorMapReplaceAddress(&map, (void *)(uintptr_t)(other + (1ull << 40))),
               CUDA_ERROR_INVALID_VALUE);
    }
    CHECK(cuMemFree_v2(other));

    CHECK(cuMemFree_v2(buf));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("tensor_map");
}

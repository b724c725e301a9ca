/* The driver's export tables, as the CUDA runtime uses them: each served at one address with
 * NVIDIA's size word; the runtime interface's primary context left inactive until retained, and
 * current before that; context-local storage kept per context, a miss INVALID_HANDLE, and the
 * destructors run when a context goes; the tools entries; the integrity check's constants.
 * These are the library's own tables, so: through mps only (MPS_ONLY=1).
 * Usage: export_tables <test_kernels.ptx> (not used) */
#include <string.h>

#include "cuda_api.h"

typedef void (*cls_dtor)(CUcontext, void *, void *);

static const void *const *table(const char *hex) {
    CUuuid id;
    for (int i = 0; i < 16; i++) {
        unsigned b = 0;
        sscanf(hex + 2 * i, "%2x", &b);
        id.bytes[i] = (char)b;
    }
    const void *t = NULL;
    CHECK(cuGetExportTable(&t, &id));
    ASSERT(t != NULL, "table %s is NULL", hex);
    return (const void *const *)t;
}

/* The function in slot `i` of table `t`, as a pointer to be converted to its type. */
#define ENTRY(fn, t, i) (*(const void **)&(fn) = (t)[i])

static int destroyed;
static void *destroyed_value;

static void on_destroy(CUcontext ctx, void *key, void *value) {
    (void)ctx;
    (void)key;
    destroyed++;
    destroyed_value = value;
}

int main(void) {
    requires_mps("export_tables");
    CHECK(cuInit(0));

    /* 6bd5fb6c: [2] is the primary context, not retained; it may be made current first. */
    const void *const *cudart = table("6bd5fb6c5bf4e74a8987d93912fd9df9");
    ASSERT(((const size_t *)cudart)[0] == 104 && cudart[10] == NULL, "cudart interface layout");
    ASSERT(table("6bd5fb6c5bf4e74a8987d93912fd9df9") == cudart, "a second, other table");
    CUresult (*primary)(CUcontext *, CUdevice);
    ENTRY(primary, cudart, 2);
    CUcontext p = NULL, r = NULL;
    CHECK(primary(&p, 0));
    unsigned flags = 9;
    int active = 9;
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    ASSERT(p != NULL && active == 0, "primary %p active %d", (void *)p, active);
    CHECK(cuCtxSetCurrent(p));
    CHECK(cuDevicePrimaryCtxRetain(&r, 0));
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    ASSERT(r == p && active == 1, "retained %p active %d", (void *)r, active);

    /* 42d85a81: [2] is the calling thread's current context. */
    const void *const *tls = table("42d85a8123f6cb478298f6e78a3aecdc");
    CUresult (*thread_ctx)(CUcontext *);
    ENTRY(thread_ctx, tls, 2);
    CUcontext cur = NULL;
    CHECK(thread_ctx(&cur));
    ASSERT(cur == p, "tools TLS context %p", (void *)cur);

    /* c693336e: put, delete, get; per context; NULL is the current one. */
    const void *const *cls = table("c693336e1121df11a8c368f355d89593");
    ASSERT(cls[3] == NULL, "storage slot 3 not NULL");
    CUresult (*put)(CUcontext, void *, void *, cls_dtor);
    CUresult (*del)(CUcontext, void *);
    CUresult (*get)(void **, CUcontext, void *);
    ENTRY(put, cls, 0);
    ENTRY(del, cls, 1);
    ENTRY(get, cls, 2);
    static int key;
    void *v = (void *)1;
    EXPECT(get(&v, NULL, &key), CUDA_ERROR_INVALID_HANDLE);
    ASSERT(v == (void *)1, "a miss wrote %p", v);
    CHECK(put(NULL, &key, (void *)0x1234, on_destroy));
    CHECK(get(&v, p, &key));
    ASSERT(v == (void *)0x1234, "stored %p", v);
    CHECK(del(NULL, &key));
    EXPECT(get(&v, NULL, &key), CUDA_ERROR_INVALID_HANDLE);

    CUcontext c = NULL;
    CHECK(cuCtxCreate_v2(&c, 0, 0));
    EXPECT(get(&v, c, &key), CUDA_ERROR_INVALID_HANDLE);
    CHECK(put(c, &key, (void *)0x5678, on_destroy));
    CHECK(put(p, &key, (void *)0x9abc, NULL));
    CHECK(get(&v, NULL, &key));
    ASSERT(v == (void *)0x5678, "the created (current) context's value is %p", v);

    /* 21318c60: [4] is a context's unique ID; NULL has none. */
    const void *const *tools_ctx = table("21318c60971432488ca641ff7324c8f2");
    ASSERT(((const size_t *)tools_ctx)[0] == 744 && tools_ctx[91] == NULL, "tools context layout");
    CUresult (*ctx_id)(CUcontext, unsigned long long *);
    ENTRY(ctx_id, tools_ctx, 4);
    unsigned long long idp = 0, idc = 0, idnull = 7;
    CHECK(ctx_id(p, &idp));
    CHECK(ctx_id(c, &idc));
    CHECK(ctx_id(NULL, &idnull));
    ASSERT(idp && idc && idp != idc && idnull == 0, "ids %llu %llu %llu", idp, idc, idnull);

    /* 1734dc26: 16 functions; [4], cuBLASLt offering its callbacks, is declined with the two
       outputs left as they were (cuBLASLt goes on without them). */
    const void *const *callbacks = table("1734dc26800d47458726c0f1e7dd8bca");
    ASSERT(((const size_t *)callbacks)[0] == 136, "library callbacks layout");
    for (int i = 1; i < 17; i++) ASSERT(callbacks[i] != NULL, "callbacks slot %d is NULL", i);
    CUresult (*offer)(unsigned long long *, unsigned long long *, const void *);
    ENTRY(offer, callbacks, 4);
    unsigned long long a = 0, b = 0;
    const size_t offered[17] = {136};
    EXPECT(offer(&a, &b, offered), CUDA_ERROR_NOT_SUPPORTED);
    ASSERT(a == 0 && b == 0, "declined callbacks wrote %llx %llx", a, b);

    /* Destroying the created context runs its destructor; the primary context's value stays. */
    CHECK(cuCtxDestroy_v2(c));
    ASSERT(destroyed == 1 && destroyed_value == (void *)0x5678, "destructor ran %d times, %p",
           destroyed, destroyed_value);
    CHECK(cuCtxSetCurrent(p));
    CHECK(get(&v, NULL, &key));
    ASSERT(v == (void *)0x9abc, "the primary context's value is %p", v);

    /* 263e8860: [2] no context wraps another; [3] is 0. */
    const void *const *checks = table("263e88607cd2614392f6bbd5006dfa7e");
    CUresult (*wrapped)(CUcontext, unsigned *, CUcontext *);
    unsigned (*zero)(void);
    ENTRY(wrapped, checks, 2);
    ENTRY(zero, checks, 3);
    unsigned w = 7;
    CUcontext inner = (CUcontext)3;
    CHECK(wrapped(NULL, &w, &inner));
    ASSERT(w == 0 && inner == (CUcontext)3 && zero() == 0, "wrapped %u inner %p", w,
           (void *)inner);

    /* a094798c: [2] and [6] hand out zeroed buffers of 1024 and 14 entries. */
    const void *const *hooks = table("a094798c2e742e7493f20800200c0a66");
    void (*buffer2)(void **, size_t *);
    void (*buffer6)(void **, size_t *);
    ENTRY(buffer2, hooks, 2);
    ENTRY(buffer6, hooks, 6);
    void *buf = NULL;
    size_t len = 0;
    buffer2(&buf, &len);
    ASSERT(buf && len == 1024, "hooks buffer %p of %zu", buf, len);
    for (size_t i = 0; buf && i < len * 8; i++) ASSERT(((unsigned char *)buf)[i] == 0, "byte %zu", i);
    buffer6(&buf, &len);
    ASSERT(buf && len == 14, "hooks buffer %p of %zu", buf, len);

    /* d4082055: [1] answers runtime versions ending in 0 and 1 with NVIDIA's constants, and any
     * other with a digest of the time it is given (among others). */
    const void *const *integrity = table("d4082055bde6704b8d34ba123c66e1f2");
    CUresult (*check)(unsigned, unsigned long long, unsigned char *);
    ENTRY(check, integrity, 1);
    unsigned char d0[16], d1[16], d2[16], d3[16];
    CHECK(check(13000, 1700000000ull, d0));
    CHECK(check(13001, 1700000000ull, d1));
    ASSERT(memcmp(d0, "\x5c\x67\xcb\x03\x1c\x18\x41\x33\xe8\xd1\x4c\x1f\xaa\x83\xd3\x8e", 16) == 0 &&
               d1[7] == 0x18 && memcmp(d0, d1, 7) == 0,
           "integrity constants");
    CHECK(check(13002, 1700000000ull, d2));
    CHECK(check(13002, 1700000000ull, d3));
    ASSERT(memcmp(d2, d3, 16) == 0, "the digest is not a function of its inputs");
    CHECK(check(13002, 1700000001ull, d3));
    ASSERT(memcmp(d2, d3, 16) != 0, "the digest ignores the time");

    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    return finish("export_tables");
}

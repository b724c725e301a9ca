/* vector_add: the smallest complete mps client in C.
 *
 * Connects to the server, loads the test kernels, adds two vectors on the device and checks the
 * result. Build and run (with a server running):
 *
 *   cc -std=c11 -Wall -Wextra -Werror -I include examples/c/vector_add.c \
 *      -L target/release -lmpsclient -Wl,-rpath,target/release -o vector_add
 *   ./vector_add kernels/test_kernels.ptx
 */
#include <stdio.h>
#include <stdlib.h>

#include "mps.h"

/* Prints the failed call, its status and the library's message, and exits. */
#define CHECK(client, call)                                                      \
    do {                                                                         \
        mps_status st_ = (call);                                                 \
        if (st_ != MPS_SUCCESS) {                                                \
            char msg_[256];                                                      \
            mps_last_error((client), msg_, sizeof msg_);                         \
            fprintf(stderr, "%s failed: %s: %s\n", #call, mps_status_string(st_), \
                    msg_);                                                       \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len);
    if (!buf || fread(buf, 1, *len, f) != *len) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    const char *ptx_path = argc > 1 ? argv[1] : "kernels/test_kernels.ptx";
    mps_client *c = NULL;
    CHECK(NULL, mps_connect(NULL, &c));

    mps_device_info info;
    CHECK(c, mps_device_get_info(c, &info));
    printf("device: %s, %u SMs, %llu MiB (%s)\n", info.name, info.sm_count,
           (unsigned long long)(info.total_mem >> 20),
           info.backend == MPS_BACKEND_CUDA ? "CUDA" : "simulator");

    size_t image_len;
    char *image = read_file(ptx_path, &image_len);
    mps_module module;
    mps_function add;
    CHECK(c, mps_module_load(c, image, image_len, &module));
    CHECK(c, mps_module_get_function(c, module, "add_f32", &add));
    free(image);

    enum { N = 1 << 20 };
    float *a, *b, *out;
    /* Host buffers from the server: copies to and from them are asynchronous. */
    CHECK(c, mps_host_alloc(c, N * sizeof(float), (void **)&a));
    CHECK(c, mps_host_alloc(c, N * sizeof(float), (void **)&b));
    out = malloc(N * sizeof(float)); /* ordinary memory: the copy returns with the data */
    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 2.0f * (float)i;
    }

    mps_stream stream;
    mps_deviceptr da, db, dout;
    CHECK(c, mps_stream_create(c, 0, &stream));
    CHECK(c, mps_mem_alloc(c, N * sizeof(float), &da));
    CHECK(c, mps_mem_alloc(c, N * sizeof(float), &db));
    CHECK(c, mps_mem_alloc(c, N * sizeof(float), &dout));
    CHECK(c, mps_memcpy_htod(c, da, a, N * sizeof(float), stream));
    CHECK(c, mps_memcpy_htod(c, db, b, N * sizeof(float), stream));

    /* An address inside an allocation leads back to the whole of it. */
    mps_deviceptr base;
    size_t size;
    CHECK(c, mps_mem_get_address_range(c, db + 12, &base, &size));
    if (base != db || size != N * sizeof(float)) {
        fprintf(stderr, "the allocation holding db + 12 is not db\n");
        return 1;
    }

    uint64_t n = N;
    void *params[] = {&da, &db, &dout, &n};
    mps_dim3 grid = {256, 1, 1}, block = {256, 1, 1};
    CHECK(c, mps_launch_kernel(c, add, grid, block, 0, stream, params));
    CHECK(c, mps_memcpy_dtoh(c, out, dout, N * sizeof(float), stream));

    for (int i = 0; i < N; i++) {
        if (out[i] != 3.0f * (float)i) {
            fprintf(stderr, "out[%d] = %f, expected %f\n", i, out[i], 3.0f * (float)i);
            return 1;
        }
    }
    printf("vector_add: %d elements correct\n", N);

    CHECK(c, mps_mem_free(c, da));
    CHECK(c, mps_mem_free(c, db));
    CHECK(c, mps_mem_free(c, dout));
    CHECK(c, mps_host_free(c, a));
    CHECK(c, mps_host_free(c, b));
    CHECK(c, mps_stream_destroy(c, stream));
    CHECK(c, mps_module_unload(c, module));
    CHECK(c, mps_disconnect(c));
    free(out);
    return 0;
}

/* Graphs through the C ABI: a request (copy in, a chain of kernels, copy out) captured once and
 * launched many times with new input, each result checked; what a capture refuses, refused.
 * Usage: graph_test <test_kernels.ptx>; the server is found through MPS_PIPE_DIRECTORY. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mps.h"

#define N 1024
#define CHAIN 12
#define LAUNCHES 100

static int failures = 0;

static void check(mps_client *c, mps_status got, mps_status want, const char *what,
                  const char *words) {
    char msg[512] = {0};
    mps_last_error(c, msg, sizeof msg);
    if (got != want) {
        fprintf(stderr, "%s returned %s, expected %s (%s)\n", what, mps_status_string(got),
                mps_status_string(want), msg);
        failures++;
    } else if (words != NULL && strstr(msg, words) == NULL) {
        fprintf(stderr, "message of %s is \"%s\", lacks \"%s\"\n", what, msg, words);
        failures++;
    }
}

#define OK(c, call) check((c), (call), MPS_SUCCESS, #call, NULL)

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len);
    if (!buf || fread(buf, 1, *len, f) != *len) exit(2);
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: graph_test <test_kernels.ptx>\n");
        return 2;
    }
    mps_client *c = NULL;
    if (mps_connect(NULL, &c) != MPS_SUCCESS) {
        fprintf(stderr, "cannot connect\n");
        return 1;
    }
    size_t len = 0;
    char *ptx = read_file(argv[1], &len);
    mps_module m = 0;
    mps_function add = 0;
    OK(c, mps_module_load(c, ptx, len, &m));
    OK(c, mps_module_get_function(c, m, "add_f32", &add));
    free(ptx);

    mps_stream s = 0;
    mps_event e = 0;
    OK(c, mps_stream_create(c, 0, &s));
    OK(c, mps_event_create(c, &e));
    mps_deviceptr x = 0, one = 0;
    OK(c, mps_mem_alloc(c, N * sizeof(float), &x));
    OK(c, mps_mem_alloc(c, N * sizeof(float), &one));
    float ones = 1.0f;
    uint32_t one_bits;
    memcpy(&one_bits, &ones, sizeof one_bits);
    OK(c, mps_memset_d32(c, one, one_bits, N, s));
    void *in_p = NULL, *out_p = NULL;
    OK(c, mps_host_alloc(c, N * sizeof(float), &in_p));
    OK(c, mps_host_alloc(c, N * sizeof(float), &out_p));
    float *in = in_p, *out = out_p;
    OK(c, mps_stream_synchronize(c, s));

    /* The request, captured: in -> x, x += 1 twelve times, x -> out. */
    OK(c, mps_stream_begin_capture(c, s));
    OK(c, mps_memcpy_htod(c, x, in, N * sizeof(float), s));
    uint64_t n = N;
    void *params[] = {&x, &one, &x, &n};
    mps_dim3 grid = {N / 128, 1, 1}, block = {128, 1, 1};
    for (int k = 0; k < CHAIN; k++) {
        OK(c, mps_launch_kernel(c, add, grid, block, 0, s, params));
    }
    OK(c, mps_memcpy_dtoh(c, out, x, N * sizeof(float), s));
    /* Waiting for a capturing stream is refused (its work does not run). */
    check(c, mps_stream_synchronize(c, s), MPS_ERROR_INVALID_VALUE,
          "mps_stream_synchronize while capturing", "captures a graph");
    check(c, mps_synchronize(c), MPS_ERROR_INVALID_VALUE, "mps_synchronize while capturing",
          "captures a graph");
    check(c, mps_event_record(c, e, s), MPS_ERROR_INVALID_VALUE,
          "mps_event_record while capturing", "captures a graph");
    mps_graph g = 0;
    OK(c, mps_stream_end_capture(c, s, &g));
    check(c, mps_stream_end_capture(c, s, &g), MPS_ERROR_INVALID_VALUE,
          "mps_stream_end_capture twice", "not capturing");
    check(c, mps_stream_end_capture(c, s, NULL), MPS_ERROR_INVALID_VALUE,
          "mps_stream_end_capture into NULL", "graph");
    mps_graph_exec exec = 0;
    OK(c, mps_graph_instantiate(c, g, &exec));
    OK(c, mps_graph_destroy(c, g));
    check(c, mps_graph_instantiate(c, g, &exec), MPS_ERROR_INVALID_HANDLE,
          "mps_graph_instantiate of a destroyed graph", "does not belong");

    int wrong = 0;
    for (int launch = 0; launch < LAUNCHES; launch++) {
        for (int i = 0; i < N; i++) in[i] = (float)(launch * N + i);
        OK(c, mps_graph_launch(c, exec, s));
        OK(c, mps_stream_synchronize(c, s));
        for (int i = 0; i < N; i++) {
            if (out[i] != (float)(launch * N + i + CHAIN)) wrong++;
        }
    }
    if (wrong != 0) {
        fprintf(stderr, "%d of %d results wrong\n", wrong, LAUNCHES * N);
        failures++;
    }
    OK(c, mps_graph_exec_destroy(c, exec));
    /* A launch is asynchronous: the server's refusal is reported by the next call. */
    mps_status st = mps_graph_launch(c, exec, s);
    if (st == MPS_SUCCESS) st = mps_synchronize(c);
    check(c, st, MPS_ERROR_INVALID_HANDLE, "mps_graph_launch of a destroyed graph",
          "does not belong");
    OK(c, mps_host_free(c, in_p));
    OK(c, mps_host_free(c, out_p));
    OK(c, mps_disconnect(c));
    if (failures != 0) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("%d graph launches correct; all checks passed\n", LAUNCHES);
    return 0;
}

/* The C ABI as a C program uses it: every call's status, and the messages of failures.
 * Usage: api_test <test_kernels.ptx>; the server is found through MPS_PIPE_DIRECTORY. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mps.h"

static int failures = 0;

/* Checks that `call` returns `want`; on a failure other than the expected one, prints it. When
 * `words` is not NULL the thread's last error message must contain them. */
#define EXPECT(client, call, want, words)                                                  \
    do {                                                                                   \
        mps_status got_ = (call);                                                          \
        char msg_[512] = {0};                                                              \
        mps_last_error((client), msg_, sizeof msg_);                                       \
        if (got_ != (want)) {                                                              \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, \
                    #call, mps_status_string(got_), mps_status_string(want), msg_);        \
            failures++;                                                                    \
        } else if ((words) != NULL && strstr(msg_, (words) ? (words) : "") == NULL) {      \
            fprintf(stderr, "%s:%d: message of %s is \"%s\", lacks \"%s\"\n", __FILE__,     \
                    __LINE__, #call, msg_, (const char *)(words));                         \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

#define OK(client, call) EXPECT(client, call, MPS_SUCCESS, (const char *)NULL)

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
        fprintf(stderr, "usage: api_test <test_kernels.ptx>\n");
        return 2;
    }
    /* Status names, including one no release defines. */
    if (strcmp(mps_status_string(MPS_ERROR_ILLEGAL_ADDRESS), "MPS_ERROR_ILLEGAL_ADDRESS") != 0 ||
        strcmp(mps_status_string(9999), "MPS_ERROR_UNKNOWN_STATUS") != 0) {
        fprintf(stderr, "mps_status_string is wrong\n");
        failures++;
    }

    EXPECT(NULL, mps_connect(NULL, NULL), MPS_ERROR_INVALID_VALUE, "out is NULL");
    mps_client *bogus = NULL;
    EXPECT(NULL, mps_connect("/nonexistent/dir", &bogus), MPS_ERROR_CONNECTION, "mps.sock");

    mps_client *c = NULL;
    OK(NULL, mps_connect(NULL, &c));

    /* Foreign and NULL client pointers. */
    int not_a_client = 0;
    mps_deviceptr d = 0;
    EXPECT((mps_client *)&not_a_client, mps_mem_alloc((mps_client *)&not_a_client, 16, &d),
           MPS_ERROR_INVALID_HANDLE, "not a connected mps_client");
    EXPECT(NULL, mps_mem_alloc(NULL, 16, &d), MPS_ERROR_INVALID_VALUE, "client is NULL");

    /* NULL out-pointers and zero sizes. */
    EXPECT(c, mps_mem_alloc(c, 16, NULL), MPS_ERROR_INVALID_VALUE, "dptr is NULL");
    EXPECT(c, mps_mem_alloc(c, 0, &d), MPS_ERROR_INVALID_VALUE, "0 bytes");
    EXPECT(c, mps_device_get_info(c, NULL), MPS_ERROR_INVALID_VALUE, "info is NULL");
    size_t free_b = 0, total_b = 0;
    EXPECT(c, mps_mem_get_info(c, NULL, &total_b), MPS_ERROR_INVALID_VALUE, "free is NULL");
    OK(c, mps_mem_get_info(c, &free_b, &total_b));
    if (free_b == 0 || free_b > total_b) {
        fprintf(stderr, "mem_get_info: free %zu total %zu\n", free_b, total_b);
        failures++;
    }

    /* Where this client's kernels run: every SM of the device, unless its share is lowered by
     * MPS_ACTIVE_THREAD_PERCENTAGE (then at least that share, rounded up, and not all). */
    mps_device_info info;
    OK(c, mps_device_get_info(c, &info));
    uint32_t sms = 0, device_sms = 0;
    EXPECT(c, mps_sm_get_info(c, NULL, &device_sms), MPS_ERROR_INVALID_VALUE, "sms is NULL");
    OK(c, mps_sm_get_info(c, &sms, &device_sms));
    const char *share = getenv("MPS_ACTIVE_THREAD_PERCENTAGE");
    unsigned long percent = share ? strtoul(share, NULL, 10) : 100;
    if (device_sms != info.sm_count || sms == 0 || sms > device_sms ||
        (unsigned long)sms * 100 < percent * device_sms || (percent < 100 && sms == device_sms)) {
        fprintf(stderr, "mps_sm_get_info: %u of %u SMs (device: %u) with a share of %lu%%\n", sms,
                device_sms, info.sm_count, percent);
        failures++;
    }
    printf("api_test: %u of %u SMs\n", sms, device_sms);

    void *host = NULL;
    EXPECT(c, mps_host_alloc(c, 0, &host), MPS_ERROR_INVALID_VALUE, "0-byte");
    EXPECT(c, mps_host_free(c, NULL), MPS_ERROR_INVALID_VALUE, "ptr is NULL");
    int stack_var = 0;
    EXPECT(c, mps_host_free(c, &stack_var), MPS_ERROR_INVALID_VALUE, "not the start of a host buffer");

    OK(c, mps_mem_alloc(c, 4096, &d));
    EXPECT(c, mps_memcpy_htod(c, d, NULL, 16, 0), MPS_ERROR_INVALID_VALUE, "src is NULL");
    EXPECT(c, mps_memcpy_dtoh(c, NULL, d, 16, 0), MPS_ERROR_INVALID_VALUE, "dst is NULL");
    char buf[64] = {0};
    EXPECT(c, mps_memcpy_htod(c, d, buf, 0, 0), MPS_ERROR_INVALID_VALUE, "0 bytes");
    EXPECT(c, mps_memcpy_htod(c, d + 4090, buf, 64, 0), MPS_ERROR_INVALID_HANDLE, "past the end");
    EXPECT(c, mps_mem_free(c, 0xdead00), MPS_ERROR_INVALID_HANDLE, "not an allocation of this client");

    /* Unknown handles. */
    EXPECT(c, mps_stream_synchronize(c, 12345), MPS_ERROR_INVALID_HANDLE, "not a stream");
    EXPECT(c, mps_event_record(c, 777, 0), MPS_ERROR_INVALID_HANDLE, "not a event");
    EXPECT(c, mps_module_unload(c, 4242), MPS_ERROR_INVALID_HANDLE, NULL);

    /* Modules and kernels. */
    size_t len;
    char *image = read_file(argv[1], &len);
    mps_module module = 0;
    const char junk[] = "definitely not a module";
    EXPECT(c, mps_module_load(c, junk, sizeof junk, &module), MPS_ERROR_INVALID_IMAGE, "not PTX");
    EXPECT(c, mps_module_load(c, NULL, 10, &module), MPS_ERROR_INVALID_VALUE, "image is NULL");
    EXPECT(c, mps_module_load(c, image, 0, &module), MPS_ERROR_INVALID_VALUE, "length is 0");
    OK(c, mps_module_load(c, image, len, &module));
    free(image);
    mps_function fill = 0;
    EXPECT(c, mps_module_get_function(c, module, "nope", &fill), MPS_ERROR_NOT_FOUND, "nope");
    EXPECT(c, mps_module_get_function(c, module, NULL, &fill), MPS_ERROR_INVALID_VALUE, "name is NULL");
    OK(c, mps_module_get_function(c, module, "fill_u32", &fill));
    size_t off = 0, size = 0;
    OK(c, mps_function_get_param_info(c, fill, 1, &off, &size));
    if (off != 8 || size != 4) {
        fprintf(stderr, "fill_u32 parameter 1 at %zu size %zu, expected 8 and 4\n", off, size);
        failures++;
    }
    EXPECT(c, mps_function_get_param_info(c, fill, 3, &off, &size), MPS_ERROR_INVALID_VALUE,
           "no parameter 3");

    /* Launches. */
    uint32_t value = 0x5eed;
    uint64_t n = 1024;
    void *params[] = {&d, &value, &n};
    mps_dim3 zero = {0, 1, 1}, one = {1, 1, 1}, block = {128, 1, 1};
    /* A bad geometry fails in the launch call itself, as with CUDA; the stream carries on. */
    EXPECT(c, mps_launch_kernel(c, fill, zero, block, 0, 0, params), MPS_ERROR_INVALID_VALUE,
           "zero extent");
    mps_dim3 too_wide = {2048, 1, 1};
    EXPECT(c, mps_launch_kernel(c, fill, one, too_wide, 0, 0, params), MPS_ERROR_INVALID_VALUE,
           "1024 threads");
    OK(c, mps_stream_synchronize(c, 0));
    EXPECT(c, mps_launch_kernel(c, fill, one, block, 0, 0, NULL), MPS_ERROR_INVALID_VALUE,
           "params is NULL");
    EXPECT(c, mps_launch_kernel(c, 99, one, block, 0, 0, params), MPS_ERROR_INVALID_HANDLE, NULL);

    mps_stream s = 0;
    mps_event e0 = 0, e1 = 0;
    OK(c, mps_stream_create(c, 0, &s));
    OK(c, mps_event_create(c, &e0));
    OK(c, mps_event_create(c, &e1));
    OK(c, mps_event_record(c, e0, s));
    OK(c, mps_launch_kernel(c, fill, one, block, 0, s, params));
    OK(c, mps_event_record(c, e1, s));
    OK(c, mps_event_synchronize(c, e1));
    OK(c, mps_event_query(c, e1));
    OK(c, mps_stream_query(c, s));
    float ms = -1;
    OK(c, mps_event_elapsed_ms(c, &ms, e0, e1));
    if (!(ms >= 0)) {
        fprintf(stderr, "elapsed %f ms\n", ms);
        failures++;
    }
    uint32_t words[1024];
    OK(c, mps_memcpy_dtoh(c, words, d, sizeof words, s));
    for (int i = 0; i < 1024; i++) {
        if (words[i] != 0x5eed) {
            fprintf(stderr, "word %d is %x\n", i, words[i]);
            failures++;
            break;
        }
    }
    OK(c, mps_memset_d8(c, d, 0xab, 4096, 0));
    OK(c, mps_synchronize(c));
    OK(c, mps_memcpy_dtoh(c, buf, d, 4, 0));
    if ((unsigned char)buf[0] != 0xab) {
        fprintf(stderr, "memset_d8 did not land\n");
        failures++;
    }

    /* A fault poisons the client, with a message naming the kernel where the server can tell
     * (the simulator); on a GPU a fault ends the whole context, asynchronously, and the message
     * says so. */
    mps_function fault = 0;
    OK(c, mps_module_get_function(c, module, "fault_write", &fault));
    uint64_t wild = 0x10;
    void *fparams[] = {&wild};
    OK(c, mps_launch_kernel(c, fault, one, one, 0, 0, fparams));
    EXPECT(c, mps_synchronize(c), MPS_ERROR_ILLEGAL_ADDRESS,
           info.backend == MPS_BACKEND_CUDA ? "context failed" : "fault_write");
    EXPECT(c, mps_mem_alloc(c, 16, &d), MPS_ERROR_ILLEGAL_ADDRESS, NULL);

    OK(c, mps_disconnect(c));
    EXPECT(c, mps_disconnect(c), MPS_ERROR_INVALID_HANDLE, "not a connected mps_client");
    EXPECT(c, mps_synchronize(c), MPS_ERROR_INVALID_HANDLE, NULL);

    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("api_test: all checks passed\n");
    return 0;
}

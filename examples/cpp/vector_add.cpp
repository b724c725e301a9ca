// vector_add: an mps client in C++ with include/mps.hpp.
//
//   c++ -std=c++17 -Wall -Wextra -Werror -I include examples/cpp/vector_add.cpp
//       -L target/release -lmpsclient -Wl,-rpath,target/release -o vector_add_cpp
//   ./vector_add_cpp kernels/test_kernels.ptx
// (one command line; split here for width)
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "mps.hpp"

int main(int argc, char **argv) {
    const char *ptx_path = argc > 1 ? argv[1] : "kernels/test_kernels.ptx";
    std::ifstream file(ptx_path, std::ios::binary);
    std::vector<char> image((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    try {
        mps::client c;  // $MPS_PIPE_DIRECTORY, else /tmp/mps
        mps_device_info info = c.device_info();
        std::printf("device: %s, %u SMs\n", info.name, info.sm_count);

        // Failures are exceptions carrying the status and message.
        try {
            const char junk[] = "not a module";
            mps::module bad(c, junk, sizeof junk);
            std::fprintf(stderr, "a junk module loaded\n");
            return 1;
        } catch (const mps::error &e) {
            if (e.status() != MPS_ERROR_INVALID_IMAGE) {
                std::fprintf(stderr, "unexpected: %s\n", e.what());
                return 1;
            }
        }

        mps::module m(c, image);
        mps::kernel add = m.function("add_f32");
        mps::kernel saxpy = m.function("saxpy_f32");

        const std::size_t n = 1 << 20;
        mps::host_buffer a(c, n * sizeof(float)), b(c, n * sizeof(float));
        for (std::size_t i = 0; i < n; i++) {
            a.as<float>()[i] = float(i);
            b.as<float>()[i] = 2.0f * float(i);
        }
        mps::stream s1(c), s2(c);
        mps::event added(c);
        mps::device_buffer da(c, n * sizeof(float)), db(c, n * sizeof(float)),
            dout(c, n * sizeof(float));
        da.copy_from(a.data(), n * sizeof(float), s1);
        db.copy_from(b.data(), n * sizeof(float), s1);

        const uint64_t count = n;
        const mps_deviceptr pa = da.address(), pb = db.address(), pout = dout.address();
        add.launch({256, 1, 1}, {256, 1, 1}, 0, s1, pa, pb, pout, count);
        added.record(s1);
        s2.wait(added);
        const float half = 0.5f;
        saxpy.launch({256, 1, 1}, {256, 1, 1}, 0, s2, half, pa, pout, count);

        std::vector<float> out(n);
        dout.copy_to(out.data(), n * sizeof(float), s2);
        for (std::size_t i = 0; i < n; i++) {
            const float want = 3.0f * float(i) + 0.5f * float(i);
            if (out[i] != want) {
                std::fprintf(stderr, "out[%zu] = %f, expected %f\n", i, out[i], want);
                return 1;
            }
        }
        std::printf("vector_add (C++): %zu elements correct\n", n);
    } catch (const mps::error &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}

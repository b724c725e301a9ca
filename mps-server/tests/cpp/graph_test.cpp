// Graphs through mps.hpp: captured, moved between owners, instantiated and launched many times,
// each result checked. Usage: graph_test_cpp <test_kernels.ptx>.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "mps.hpp"

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: graph_test_cpp <test_kernels.ptx>\n");
        return 2;
    }
    try {
        std::ifstream file(argv[1], std::ios::binary);
        std::vector<char> ptx((std::istreambuf_iterator<char>(file)),
                              std::istreambuf_iterator<char>());
        mps::client c;
        mps::module m(c, ptx);
        mps::kernel fill = m.function("fill_u32");
        const uint64_t n = 4096;
        mps::stream s(c);
        mps::device_buffer d(c, n * 4);
        mps::host_buffer out(c, n * 4);
        const uint32_t value = 7;
        const mps_deviceptr p = d.address();

        // The kernel's arguments are taken when it is captured.
        s.begin_capture();
        fill.launch({n / 256, 1, 1}, {256, 1, 1}, 0, s, p, value, n);
        d.fill_u32(0, n, s);
        fill.launch({n / 256, 1, 1}, {256, 1, 1}, 0, s, p, value + 1, n);
        d.copy_to(out.data(), n * 4, s);
        mps::graph captured = s.end_capture();
        mps::graph moved(std::move(captured));
        mps::graph_exec first(moved);
        mps::graph_exec exec(std::move(first));
        moved = mps::graph(std::move(moved));

        const int launches = 50;
        int wrong = 0;
        for (int k = 0; k < launches; k++) {
            std::memset(out.data(), 0, n * 4);
            exec.launch(s);
            s.synchronize();
            for (uint64_t i = 0; i < n; i++) {
                wrong += out.as<uint32_t>()[i] != value + 1;
            }
        }
        if (wrong != 0) {
            std::fprintf(stderr, "%d results wrong\n", wrong);
            return 1;
        }
        // Waiting for a capturing stream throws.
        s.begin_capture();
        bool refused = false;
        try {
            s.synchronize();
        } catch (const mps::error &e) {
            refused = e.status() == MPS_ERROR_INVALID_VALUE;
        }
        mps::graph empty = s.end_capture();
        if (!refused) {
            std::fprintf(stderr, "synchronising a capturing stream did not throw\n");
            return 1;
        }
        std::printf("%d graph launches correct; all checks passed\n", launches);
    } catch (const mps::error &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}

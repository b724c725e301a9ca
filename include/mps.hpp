// mps.hpp: a header-only C++17 layer over the mps C API (mps.h).
//
// RAII owners for the client and for what it creates (device and host buffers, streams, events,
// modules, graphs); failures throw mps::error, which carries the status and the library's message.
// Nothing here copies data behind your back: buffers are moved, never copied, and a kernel's
// arguments are passed to the launch by address, as cuLaunchKernel takes them.
//
// Objects made by a client refer to it and must not outlive it. Destructors never throw: a
// failure to free (a lost connection) is ignored, since the server frees everything a client
// held when it goes away.
#ifndef MPS_HPP
#define MPS_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mps.h"

namespace mps {

/// A failed mps call: its status and message.
class error : public std::runtime_error {
  public:
    error(mps_status status, const std::string &message)
        : std::runtime_error(std::string(mps_status_string(status)) + ": " + message),
          status_(status) {}
    /// The status the call returned.
    mps_status status() const noexcept { return status_; }

  private:
    mps_status status_;
};

namespace detail {
/// Throws mps::error for a failed status, with the calling thread's last message.
inline void check(mps_status status, const mps_client *client) {
    if (status == MPS_SUCCESS) {
        return;
    }
    char message[512] = {0};
    mps_last_error(client, message, sizeof message);
    throw error(status, message);
}
}  // namespace detail

using dim3 = mps_dim3;

class stream;
class event;
class graph;

/// A connection to the mps server. Movable, not copyable; disconnects when destroyed.
class client {
  public:
    /// Connects to device 0 of those this process sees through `pipe_dir` (nullptr:
    /// $MPS_PIPE_DIRECTORY, else /tmp/mps).
    explicit client(const char *pipe_dir = nullptr) {
        detail::check(mps_connect(pipe_dir, &c_), nullptr);
    }
    /// Connects to device `device` (0 to device_count() - 1) of those this process sees.
    client(const char *pipe_dir, std::uint32_t device) {
        detail::check(mps_connect_device(pipe_dir, device, &c_), nullptr);
    }

    /// How many devices this process sees through `pipe_dir` (after CUDA_VISIBLE_DEVICES).
    static std::uint32_t device_count(const char *pipe_dir = nullptr) {
        std::uint32_t count = 0;
        detail::check(mps_device_count(pipe_dir, &count), nullptr);
        return count;
    }
    ~client() {
        if (c_ != nullptr) {
            mps_disconnect(c_);
        }
    }
    client(const client &) = delete;
    client &operator=(const client &) = delete;
    client(client &&other) noexcept : c_(std::exchange(other.c_, nullptr)) {}
    client &operator=(client &&other) noexcept {
        if (this != &other) {
            if (c_ != nullptr) {
                mps_disconnect(c_);
            }
            c_ = std::exchange(other.c_, nullptr);
        }
        return *this;
    }

    /// The C handle, for calls this layer does not wrap.
    mps_client *get() const noexcept { return c_; }

    mps_device_info device_info() const {
        mps_device_info info;
        detail::check(mps_device_get_info(c_, &info), c_);
        return info;
    }

    /// (free, total) device memory in bytes (total is the client's limit, if it has one).
    std::pair<std::size_t, std::size_t> mem_info() const {
        std::size_t free = 0, total = 0;
        detail::check(mps_mem_get_info(c_, &free, &total), c_);
        return {free, total};
    }

    /// (SMs this client's kernels may use now, SMs of the device).
    std::pair<std::uint32_t, std::uint32_t> sm_info() const {
        std::uint32_t sms = 0, device_sms = 0;
        detail::check(mps_sm_get_info(c_, &sms, &device_sms), c_);
        return {sms, device_sms};
    }

    /// Waits for all of this client's streams.
    void synchronize() const { detail::check(mps_synchronize(c_), c_); }

  private:
    mps_client *c_ = nullptr;
};

/// A stream of a client (or its default stream, which needs no creation).
class stream {
  public:
    /// The client's default stream.
    static stream default_of(const client &c) noexcept { return stream(c.get(), 0, false); }
    /// A new stream (lower priority numbers are more urgent).
    explicit stream(const client &c, int32_t priority = 0) : c_(c.get()) {
        detail::check(mps_stream_create(c_, priority, &s_), c_);
    }
    ~stream() {
        if (owned_) {
            mps_stream_destroy(c_, s_);
        }
    }
    stream(const stream &) = delete;
    stream &operator=(const stream &) = delete;
    stream(stream &&other) noexcept
        : c_(other.c_), s_(other.s_), owned_(std::exchange(other.owned_, false)) {}
    /// Destroys the stream this owner held (if any) and takes `other`'s.
    stream &operator=(stream &&other) noexcept {
        stream taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(s_, taken.s_);
        std::swap(owned_, taken.owned_);
        return *this;
    }

    mps_stream get() const noexcept { return s_; }
    void synchronize() const { detail::check(mps_stream_synchronize(c_, s_), c_); }
    /// True once all work submitted so far has completed.
    bool query() const {
        mps_status st = mps_stream_query(c_, s_);
        if (st == MPS_ERROR_NOT_READY) {
            return false;
        }
        detail::check(st, c_);
        return true;
    }
    /// Makes later work in this stream wait for the latest record of `e`.
    inline void wait(const event &e) const;
    /// Records the work submitted to this stream from now on into a graph instead of running it
    /// (see mps_stream_begin_capture for what a capture may hold).
    void begin_capture() const { detail::check(mps_stream_begin_capture(c_, s_), c_); }
    /// Ends the capture and returns the graph of what it recorded.
    inline graph end_capture() const;

  private:
    stream(mps_client *c, mps_stream s, bool owned) noexcept : c_(c), s_(s), owned_(owned) {}
    mps_client *c_;
    mps_stream s_ = 0;
    bool owned_ = true;
};

/// An event.
class event {
  public:
    explicit event(const client &c) : c_(c.get()) { detail::check(mps_event_create(c_, &e_), c_); }
    ~event() {
        if (c_ != nullptr) {
            mps_event_destroy(c_, e_);
        }
    }
    event(const event &) = delete;
    event &operator=(const event &) = delete;
    event(event &&other) noexcept : c_(std::exchange(other.c_, nullptr)), e_(other.e_) {}
    /// Destroys the event this owner held (if any) and takes `other`'s.
    event &operator=(event &&other) noexcept {
        event taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(e_, taken.e_);
        return *this;
    }

    mps_event get() const noexcept { return e_; }
    void record(const stream &s) const { detail::check(mps_event_record(c_, e_, s.get()), c_); }
    void synchronize() const { detail::check(mps_event_synchronize(c_, e_), c_); }
    bool query() const {
        mps_status st = mps_event_query(c_, e_);
        if (st == MPS_ERROR_NOT_READY) {
            return false;
        }
        detail::check(st, c_);
        return true;
    }
    /// Milliseconds from the latest record of `start` to the latest record of `end`.
    static float elapsed_ms(const event &start, const event &end) {
        float ms = 0;
        detail::check(mps_event_elapsed_ms(start.c_, &ms, start.e_, end.e_), start.c_);
        return ms;
    }

  private:
    mps_client *c_;
    mps_event e_ = 0;
};

inline void stream::wait(const event &e) const {
    detail::check(mps_stream_wait_event(c_, s_, e.get()), c_);
}

/// A graph captured from a stream (stream::end_capture), destroyed when its owner is.
class graph {
  public:
    ~graph() {
        if (c_ != nullptr) {
            mps_graph_destroy(c_, g_);
        }
    }
    graph(const graph &) = delete;
    graph &operator=(const graph &) = delete;
    graph(graph &&other) noexcept : c_(std::exchange(other.c_, nullptr)), g_(other.g_) {}
    /// Destroys the graph this owner held (if any) and takes `other`'s.
    graph &operator=(graph &&other) noexcept {
        graph taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(g_, taken.g_);
        return *this;
    }

    mps_graph get() const noexcept { return g_; }
    mps_client *client_handle() const noexcept { return c_; }

  private:
    friend class stream;
    graph(mps_client *c, mps_graph g) noexcept : c_(c), g_(g) {}
    mps_client *c_;
    mps_graph g_ = 0;
};

inline graph stream::end_capture() const {
    mps_graph g = 0;
    detail::check(mps_stream_end_capture(c_, s_, &g), c_);
    return graph(c_, g);
}

/// An executable graph, made from a captured one (which may then go); launched into streams.
class graph_exec {
  public:
    explicit graph_exec(const graph &g) : c_(g.client_handle()) {
        detail::check(mps_graph_instantiate(c_, g.get(), &e_), c_);
    }
    ~graph_exec() {
        if (c_ != nullptr) {
            mps_graph_exec_destroy(c_, e_);
        }
    }
    graph_exec(const graph_exec &) = delete;
    graph_exec &operator=(const graph_exec &) = delete;
    graph_exec(graph_exec &&other) noexcept : c_(std::exchange(other.c_, nullptr)), e_(other.e_) {}
    /// Destroys the executable graph this owner held (if any) and takes `other`'s.
    graph_exec &operator=(graph_exec &&other) noexcept {
        graph_exec taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(e_, taken.e_);
        return *this;
    }

    mps_graph_exec get() const noexcept { return e_; }
    /// Runs the graph in `s`, asynchronously, with the stream's priority and on the client's SMs.
    void launch(const stream &s) const { detail::check(mps_graph_launch(c_, e_, s.get()), c_); }

  private:
    mps_client *c_;
    mps_graph_exec e_ = 0;
};

/// Device memory, freed when destroyed.
class device_buffer {
  public:
    device_buffer(const client &c, std::size_t bytes) : c_(c.get()), size_(bytes) {
        detail::check(mps_mem_alloc(c_, bytes, &p_), c_);
    }
    ~device_buffer() {
        if (c_ != nullptr) {
            mps_mem_free(c_, p_);
        }
    }
    device_buffer(const device_buffer &) = delete;
    device_buffer &operator=(const device_buffer &) = delete;
    device_buffer(device_buffer &&other) noexcept
        : c_(std::exchange(other.c_, nullptr)), p_(other.p_), size_(other.size_) {}
    /// Frees the memory this owner held (if any) and takes `other`'s.
    device_buffer &operator=(device_buffer &&other) noexcept {
        device_buffer taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(p_, taken.p_);
        std::swap(size_, taken.size_);
        return *this;
    }

    /// The device address (pass `&buffer.address()`'s value to a kernel: see kernel::launch).
    mps_deviceptr address() const noexcept { return p_; }
    std::size_t size() const noexcept { return size_; }

    /// Copies `bytes` from host memory in `s` (asynchronous from an mps::host_buffer; from other
    /// memory it returns once the source was read).
    void copy_from(const void *src, std::size_t bytes, const stream &s) const {
        detail::check(mps_memcpy_htod(c_, p_, src, bytes, s.get()), c_);
    }
    /// Copies `bytes` to host memory in `s` (asynchronous into an mps::host_buffer; into other
    /// memory it returns once the data arrived).
    void copy_to(void *dst, std::size_t bytes, const stream &s) const {
        detail::check(mps_memcpy_dtoh(c_, dst, p_, bytes, s.get()), c_);
    }
    void fill_u32(uint32_t value, std::size_t count, const stream &s) const {
        detail::check(mps_memset_d32(c_, p_, value, count, s.get()), c_);
    }

  private:
    mps_client *c_;
    mps_deviceptr p_ = 0;
    std::size_t size_;
};

/// Host memory shared with the server: copies from and to it are fully asynchronous.
class host_buffer {
  public:
    host_buffer(const client &c, std::size_t bytes) : c_(c.get()), size_(bytes) {
        detail::check(mps_host_alloc(c_, bytes, &p_), c_);
    }
    ~host_buffer() {
        if (c_ != nullptr) {
            mps_host_free(c_, p_);
        }
    }
    host_buffer(const host_buffer &) = delete;
    host_buffer &operator=(const host_buffer &) = delete;
    host_buffer(host_buffer &&other) noexcept
        : c_(std::exchange(other.c_, nullptr)), p_(other.p_), size_(other.size_) {}
    /// Frees the buffer this owner held (if any) and takes `other`'s.
    host_buffer &operator=(host_buffer &&other) noexcept {
        host_buffer taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(p_, taken.p_);
        std::swap(size_, taken.size_);
        return *this;
    }

    void *data() const noexcept { return p_; }
    template <class T>
    T *as() const noexcept {
        return static_cast<T *>(p_);
    }
    std::size_t size() const noexcept { return size_; }

  private:
    mps_client *c_;
    void *p_ = nullptr;
    std::size_t size_;
};

/// A kernel of a loaded module.
class kernel {
  public:
    kernel(mps_client *c, mps_function f) noexcept : c_(c), f_(f) {}
    mps_function get() const noexcept { return f_; }

    /// Launches in `s`; `args` are the kernel's parameters, passed by address (no copies).
    template <class... Args>
    void launch(dim3 grid, dim3 block, unsigned shared_mem, const stream &s,
                const Args &...args) const {
        void *params[] = {const_cast<void *>(static_cast<const void *>(&args))..., nullptr};
        detail::check(mps_launch_kernel(c_, f_, grid, block, shared_mem, s.get(), params), c_);
    }

  private:
    mps_client *c_;
    mps_function f_;
};

/// A loaded module, unloaded when destroyed.
class module {
  public:
    /// Loads an image (PTX, cubin or fatbin; the simulator takes PTX).
    module(const client &c, const void *image, std::size_t bytes) : c_(c.get()) {
        detail::check(mps_module_load(c_, image, bytes, &m_), c_);
    }
    module(const client &c, const std::vector<char> &image)
        : module(c, image.data(), image.size()) {}
    ~module() {
        if (c_ != nullptr) {
            mps_module_unload(c_, m_);
        }
    }
    module(const module &) = delete;
    module &operator=(const module &) = delete;
    module(module &&other) noexcept : c_(std::exchange(other.c_, nullptr)), m_(other.m_) {}
    /// Unloads the module this owner held (if any) and takes `other`'s.
    module &operator=(module &&other) noexcept {
        module taken(std::move(other));
        std::swap(c_, taken.c_);
        std::swap(m_, taken.m_);
        return *this;
    }

    kernel function(const char *name) const {
        mps_function f = 0;
        detail::check(mps_module_get_function(c_, m_, name, &f), c_);
        return kernel(c_, f);
    }

  private:
    mps_client *c_;
    mps_module m_ = 0;
};

// Every owner can be moved, by construction and by assignment, and never copied.
static_assert(std::is_nothrow_move_constructible_v<client> &&
              std::is_nothrow_move_assignable_v<client> && !std::is_copy_assignable_v<client>);
static_assert(std::is_nothrow_move_constructible_v<stream> &&
              std::is_nothrow_move_assignable_v<stream> && !std::is_copy_assignable_v<stream>);
static_assert(std::is_nothrow_move_constructible_v<event> &&
              std::is_nothrow_move_assignable_v<event> && !std::is_copy_assignable_v<event>);
static_assert(std::is_nothrow_move_constructible_v<device_buffer> &&
              std::is_nothrow_move_assignable_v<device_buffer> &&
              !std::is_copy_assignable_v<device_buffer>);
static_assert(std::is_nothrow_move_constructible_v<host_buffer> &&
              std::is_nothrow_move_assignable_v<host_buffer> &&
              !std::is_copy_assignable_v<host_buffer>);
static_assert(std::is_nothrow_move_constructible_v<module> &&
              std::is_nothrow_move_assignable_v<module> && !std::is_copy_assignable_v<module>);
static_assert(std::is_nothrow_move_constructible_v<graph> &&
              std::is_nothrow_move_assignable_v<graph> && !std::is_copy_assignable_v<graph>);
static_assert(std::is_nothrow_move_constructible_v<graph_exec> &&
              std::is_nothrow_move_assignable_v<graph_exec> &&
              !std::is_copy_assignable_v<graph_exec>);

}  // namespace mps

#endif  // MPS_HPP

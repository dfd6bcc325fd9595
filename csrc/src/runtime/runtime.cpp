// Errors, version, build features and the CPU worker pool.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/cpu_isa.h"
#include "runtime/internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifndef LLMCORE_VERSION_STRING
#define LLMCORE_VERSION_STRING "0.0.0"
#endif

namespace lc {

namespace {
thread_local std::string t_last_error = "no error";
}

void fail(lc_status status, const std::string& msg) { throw Error(status, msg); }

lc_status set_error(lc_status status, const char* msg) {
    t_last_error = msg ? msg : "";
    return status;
}

size_t dtype_size(int32_t dtype) {
    switch (dtype) {
        case LC_DTYPE_F32: return 4;
        case LC_DTYPE_BF16:
        case LC_DTYPE_F16: return 2;
        default: return 0;
    }
}

const char* dtype_name(int32_t dtype) {
    switch (dtype) {
        case LC_DTYPE_F32: return "float32";
        case LC_DTYPE_BF16: return "bfloat16";
        case LC_DTYPE_F16: return "float16";
        default: return "unknown";
    }
}

void check_tensor(const lc_tensor* t, const char* what, int32_t ndim) {
    require(t != nullptr, std::string(what) + " is NULL");
    require(t->data != nullptr, std::string(what) + " has no data");
    require(t->ndim == ndim, std::string(what) + " must have " + std::to_string(ndim) +
                                 " dims, got " + std::to_string(t->ndim));
    require(dtype_size(t->dtype) != 0, std::string(what) + " has an unsupported dtype");
    for (int i = 0; i < ndim; ++i)
        require(t->shape[i] >= 0, std::string(what) + " has a negative dimension");
    require(t->strides[ndim - 1] == 1 || t->shape[ndim - 1] <= 1,
            std::string(what) + " must have a unit stride in its last dimension");
}

bool is_contiguous(const lc_tensor& t) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
        if (t.shape[i] != 1 && t.strides[i] != expect) return false;
        expect *= t.shape[i];
    }
    return true;
}

bool overlaps(const lc_tensor& a, const lc_tensor& b) {
    auto extent = [](const lc_tensor& t, const char*& lo, const char*& hi) {
        int64_t last = 0;
        for (int i = 0; i < t.ndim; ++i) {
            if (t.shape[i] == 0) return false;
            last += (t.shape[i] - 1) * t.strides[i];
        }
        lo = static_cast<const char*>(t.data);
        hi = lo + (last + 1) * int64_t(dtype_size(t.dtype));
        return true;
    };
    const char *alo, *ahi, *blo, *bhi;
    if (!extent(a, alo, ahi) || !extent(b, blo, bhi)) return false;
    return alo < bhi && blo < ahi;
}

// ---- instruction sets ----------------------------------------------------------
namespace {

struct AmxState {
    bool tiles = false;  // AMX-TILE + AMX-BF16, XCR0 and the permission
    bool int8 = false;   // and AMX-INT8
};

// CPUID.(7,0):EDX bit 22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8; XCR0 bits 17-18 the
// tile configuration and data state (set by a kernel that manages them); then the
// per-process permission Linux requires before the first tile instruction
// (without it, ldtilecfg raises SIGILL).
AmxState probe_amx() {
    AmxState st;
#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return st;  // OSXSAVE
    if (__get_cpuid_max(0, nullptr) < 7) return st;
    __cpuid_count(7, 0, a, b, c, d);
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22), int8 = d & (1u << 25);
    if (!tile || !bf16) return st;
    uint32_t xlo = 0, xhi = 0;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return st;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) return st;
    st.tiles = true;
    st.int8 = int8;
#endif
    return st;
}

const AmxState& amx_state() {
    static const AmxState st = probe_amx();
    return st;
}

}  // namespace

bool amx_usable() { return amx_state().tiles; }
bool amx_int8_usable() { return amx_state().tiles && amx_state().int8; }

Isa cpu_isa() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // The AVX-512 kernels use F, BW, VL and DQ (every AVX-512 CPU since
    // Skylake-SP has all four; Xeon Phi, with F alone, runs the AVX2 ones).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return amx_usable() ? Isa::kAmx : Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
    return Isa::kScalar;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::kAmx: return "amx";
        case Isa::kAvx512: return "avx512";
        case Isa::kAvx2: return "avx2";
        default: return "scalar";
    }
}

bool parse_isa(const char* name, Isa* out) {
    if (!std::strcmp(name, "portable")) {  // the sampler's former name for scalar
        *out = Isa::kScalar;
        return true;
    }
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx})
        if (!std::strcmp(name, isa_name(isa))) {
            *out = isa;
            return true;
        }
    return false;
}

IsaSetting::IsaSetting(const char* env, Isa most) : most_(most), isa_(int(best())) {
    Isa cap;
    if (const char* v = std::getenv(env); v && parse_isa(v, &cap)) set(cap);
}

// ---- worker pool -------------------------------------------------------------
namespace {

// One parallel region at a time: the caller takes a share of the chunks and the
// workers the rest. Regions come in quick succession during a forward pass (one
// per kernel call, tens of microseconds apart), so an idle worker spins for a
// while (LLMCORE_SPIN_US, default 200 us) before it sleeps on the condition
// variable: a futex wake-up costs more than a small kernel call takes. The
// caller waits for the last chunk by spinning, then yielding.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}

int64_t spin_ns_from_env() {
    const char* v = std::getenv("LLMCORE_SPIN_US");
    if (!v || !*v) return 200'000;
    return std::max<int64_t>(0, std::atoll(v)) * 1000;
}

class Pool {
   public:
    explicit Pool(int n) : spin_ns_(spin_ns_from_env()) { resize(n); }
    ~Pool() { stop(); }

    int size() const { return int(workers_.size()) + 1; }

    void resize(int n) {
        stop();
        if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
        quit_.store(false);
        for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
    }

    void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
        if (n <= 0) return;
        int64_t chunks = std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, grain)));
        if (chunks <= 1 || in_pool_) {
            fn(0, n);
            return;
        }
        std::unique_lock<std::mutex> call(call_mu_);  // one parallel region at a time
        fn_ = &fn;
        n_ = n;
        chunks_ = chunks;
        next_.store(0, std::memory_order_relaxed);
        pending_.store(chunks, std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lk(mu_);
            generation_.fetch_add(1, std::memory_order_release);
            if (sleepers_ > 0) cv_.notify_all();
        }
        in_pool_ = true;
        work();
        in_pool_ = false;
        for (int64_t spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
            if (spins < 4096) cpu_relax();
            else std::this_thread::yield();
        }
        fn_ = nullptr;
    }

   private:
    void work() {
        for (;;) {
            const int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
            if (c >= chunks_) return;
            const int64_t b = n_ * c / chunks_, e = n_ * (c + 1) / chunks_;
            (*fn_)(b, e);
            pending_.fetch_sub(1, std::memory_order_acq_rel);
        }
    }

    void loop(int) {
        in_pool_ = true;
        uint64_t seen = generation_.load(std::memory_order_acquire);
        for (;;) {
            const auto t0 = std::chrono::steady_clock::now();
            uint32_t spins = 0;
            while (generation_.load(std::memory_order_acquire) == seen &&
                   !quit_.load(std::memory_order_relaxed)) {
                cpu_relax();
                if ((++spins & 255) == 0 &&
                    std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(spin_ns_))
                    break;
            }
            {
                std::unique_lock<std::mutex> lk(mu_);
                ++sleepers_;
                cv_.wait(lk, [&] {
                    return quit_.load() || generation_.load(std::memory_order_acquire) != seen;
                });
                --sleepers_;
                if (quit_.load()) return;
                seen = generation_.load(std::memory_order_acquire);
            }
            work();
        }
    }

    void stop() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            quit_.store(true);
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
        workers_.clear();
    }

    const int64_t spin_ns_;
    std::vector<std::thread> workers_;
    std::mutex mu_, call_mu_;
    std::condition_variable cv_;
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
    int64_t n_ = 0, chunks_ = 0;
    int sleepers_ = 0;  // guarded by mu_
    std::atomic<int64_t> next_{0}, pending_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool> quit_{false};
    static thread_local bool in_pool_;
};
thread_local bool Pool::in_pool_ = false;

std::mutex g_pool_mu;
Pool& pool() {
    static Pool p(0);
    return p;
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    pool().run(n, grain, fn);
}

int num_threads() { return pool().size(); }

}  // namespace lc

extern "C" {

const char* lc_last_error(void) { return lc::t_last_error.c_str(); }
const char* lc_version(void) { return LLMCORE_VERSION_STRING; }
int32_t lc_abi_version(void) { return LC_ABI_VERSION; }

const char* lc_build_features(void) {
    // The CPU kernel variants compiled in (each chosen at run time by what the
    // CPU runs; see lc_cpu_isa), then CUDA.
    return "cpu,scalar"
#if defined(__x86_64__)
           ",avx2,avx512,amx"
#endif
#if defined(LLMCORE_WITH_CUDA)
           ",cuda"
#endif
        ;
}

const char* lc_cpu_isa(void) { return lc::isa_name(lc::cpu_isa()); }

lc_status lc_set_num_threads(int32_t n) {
    return lc::guard([&] {
        std::lock_guard<std::mutex> lk(lc::g_pool_mu);
        lc::pool().resize(n);
    });
}

int32_t lc_get_num_threads(void) { return lc::num_threads(); }

}  // extern "C"

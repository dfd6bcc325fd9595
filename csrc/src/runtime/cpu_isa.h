// The instruction sets the CPU kernels are compiled for, and the run-time
// choice among them, shared by every kernel family (attention, linear).
#pragma once

#include <algorithm>
#include <atomic>

namespace lc {

// kAmx: AVX-512 plus the AMX tiles (AMX-TILE and AMX-BF16 in CPUID, the tile state
// enabled in XCR0, and the kernel's permission to use it granted to this process).
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// The best this CPU runs: AMX, AVX-512F, AVX2 with FMA, or scalar.
Isa cpu_isa();
// Whether the AMX tiles may be used (see kAmx). The first call asks the kernel for
// the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, once per process); any refusal, an
// old kernel or a CPU without the tiles gives false, and the AVX-512 kernels run.
bool amx_usable();
// amx_usable() and AMX-INT8 in CPUID (the integer tile products).
bool amx_int8_usable();
const char* isa_name(Isa isa);
// "scalar", "avx2", "avx512" or "amx" (isa_name's spellings); false for anything else.
bool parse_isa(const char* name, Isa* out);

// One kernel family's instruction set: the best the CPU runs and the family
// was compiled for (`most`), capped once by the environment variable `env`
// (scalar|avx2), and settable by tests that compare the variants.
class IsaSetting {
   public:
    IsaSetting(const char* env, Isa most);
    Isa best() const { return std::min(cpu_isa(), most_); }
    // Caps the set in use; returns the one in effect, min(isa, best()).
    Isa set(Isa isa) {
        const Isa eff = std::min(isa, best());
        isa_.store(int(eff), std::memory_order_relaxed);
        return eff;
    }
    Isa current() const { return Isa(isa_.load(std::memory_order_relaxed)); }

   private:
    Isa most_;
    std::atomic<int> isa_;
};

}  // namespace lc

// The dense sampler loops compiled for AVX2 + FMA (x86-64 only).
#include "common/isa_target.h"
#include "sampling/sampling_kernels.h"

#if LC_ISA_X86
#define LC_KERNELS_NS isa_avx2
#define LC_KERNELS_ISA_NAME "avx2"
#define LC_KERNELS_VBYTES 32
#define LC_KERNELS_TARGET "avx2,fma"
#include "sampling/sampling_kernels_isa.h"

const lc::sampling::Kernels* lc::sampling::kernels_avx2() { return &isa_avx2::kTable; }
#else
const lc::sampling::Kernels* lc::sampling::kernels_avx2() { return nullptr; }
#endif

// The dense sampler loops compiled for AVX-512 (x86-64 only).
#include "common/isa_target.h"
#include "sampling/sampling_kernels.h"

#if LC_ISA_X86
#define LC_KERNELS_NS isa_avx512
#define LC_KERNELS_ISA_NAME "avx512"
#define LC_KERNELS_VBYTES 64
#define LC_KERNELS_TARGET "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"
#include "sampling/sampling_kernels_isa.h"

const lc::sampling::Kernels* lc::sampling::kernels_avx512() { return &isa_avx512::kTable; }
#else
const lc::sampling::Kernels* lc::sampling::kernels_avx512() { return nullptr; }
#endif

/*
 * llmcore/runtime.h -- the base of the llmcore C ABI: export macro, ABI version,
 * status codes and errors, build facts, the CPU worker threads, and lc_tensor.
 * Every other llmcore header includes it. Conventions: llmcore/llmcore.h.
 */
#ifndef LLMCORE_RUNTIME_H
#define LLMCORE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(LLMCORE_BUILD)
#define LC_API __declspec(dllexport)
#else
#define LC_API __declspec(dllimport)
#endif
#else
#define LC_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LC_ABI_VERSION 1

/* ------------------------------------------------------------------ */
/* Status codes and errors                                             */
/* ------------------------------------------------------------------ */

typedef int32_t lc_status;

enum {
    LC_OK = 0,
    LC_ERR_INVALID_ARGUMENT = -1, /* bad shape, dtype, range, id, ... */
    LC_ERR_OUT_OF_BLOCKS = -2,    /* the block pool cannot satisfy an allocation */
    LC_ERR_UNSUPPORTED = -3,      /* valid request the build cannot do (e.g. no CUDA) */
    LC_ERR_OUT_OF_MEMORY = -4,    /* a host or device allocation failed */
    LC_ERR_INTERNAL = -5          /* a bug: an invariant was broken */
};

/* Message for the last failed call on this thread. Never NULL. The string is
 * owned by the library and valid until the next failing call on this thread. */
LC_API const char* lc_last_error(void);

/* Library version string ("major.minor.patch"); static storage. */
LC_API const char* lc_version(void);

/* ABI version this library was built with (LC_ABI_VERSION). */
LC_API int32_t lc_abi_version(void);

/* Build features as a static, comma-separated string: "cpu,scalar" and, on
 * x86-64, the SIMD kernel variants compiled in ("avx2,avx512,amx"), then "cuda"
 * when the CUDA kernels are built, e.g. "cpu,scalar,avx2,avx512,amx,cuda". Which
 * CPU variant runs is chosen at run time: lc_cpu_isa(). */
LC_API const char* lc_build_features(void);

/* The widest CPU kernel variant this CPU runs among those built: "amx" (AVX-512
 * plus the AMX tiles: AMX-TILE/BF16 in CPUID, the tile state in XCR0 and the
 * kernel's permission, which the first call requests for the process), "avx512"
 * (AVX-512 F/BW/VL/DQ), "avx2" (AVX2 + FMA) or "scalar". Static string. */
LC_API const char* lc_cpu_isa(void);

/* Threads used by CPU kernels. n <= 0 means "all hardware threads". The core
 * keeps its own pool of workers. After a call, an idle worker spins for a
 * while (LLMCORE_SPIN_US microseconds, read when the pool starts; default 200,
 * the gap between two kernels of a forward pass) before it sleeps on a
 * condition variable, so for that long after each call the workers take CPU
 * time from the host's threads; LLMCORE_SPIN_US=0 makes them sleep almost at
 * once. */
LC_API lc_status lc_set_num_threads(int32_t n);
LC_API int32_t lc_get_num_threads(void);

/* ------------------------------------------------------------------ */
/* Tensors                                                             */
/* ------------------------------------------------------------------ */

typedef enum { LC_DTYPE_F32 = 0, LC_DTYPE_BF16 = 1, LC_DTYPE_F16 = 2 } lc_dtype;
typedef enum { LC_DEVICE_CPU = 0, LC_DEVICE_CUDA = 1 } lc_device;

#define LC_MAX_DIMS 4

/* A borrowed view of memory. strides are in elements, not bytes. */
typedef struct lc_tensor {
    void* data;
    int32_t dtype;     /* lc_dtype */
    int32_t device;    /* lc_device */
    int32_t device_id; /* CUDA ordinal; 0 for CPU */
    int32_t ndim;      /* 1..LC_MAX_DIMS */
    int64_t shape[LC_MAX_DIMS];
    int64_t strides[LC_MAX_DIMS];
} lc_tensor;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLMCORE_RUNTIME_H */

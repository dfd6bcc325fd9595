// Quantized packed linear: the activation quantizer, the run-time choice of
// variant, and the scalar reference microkernel (linear_quant.h).
#include "linear/linear_quant.h"

#include "weight/weight_kquant.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace lc::linear {

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
}

namespace {

std::atomic<int> g_activation_bits{16};

struct QuantXBuf {
    std::vector<int8_t> q;
    std::vector<int16_t> q16;
    std::vector<float> scale, ssum;
    std::vector<int32_t> isum, hsum;
};

// Row blocks of x to `bits`-bit integers: q = round(x / s), s = max|x| / qmax,
// |q| <= qmax; int16 ones stored in x16_index order. `blocks` is the variant's
// quantizer (all give the same bits).
QuantX quantize(const Job& job, QuantXBuf& buf, int bits, QuantizeBlocks blocks) {
    const int64_t nb = job.K / quant::kBlock, M = job.M;
    const bool wide = bits == 16;
    (wide ? buf.q.clear() : buf.q.resize(size_t(M * job.K)));
    (wide ? buf.q16.resize(size_t(M * job.K)) : buf.q16.clear());
    buf.scale.resize(size_t(M * nb));
    buf.ssum.resize(size_t(M * nb));
    buf.isum.resize(size_t(M * nb));
    buf.hsum.resize(size_t(M * nb));
    const QuantXOut out{wide ? nullptr : buf.q.data(), wide ? buf.q16.data() : nullptr,
                        buf.scale.data(), buf.ssum.data(), buf.isum.data(), buf.hsum.data()};
    parallel_for(M * nb, std::max<int64_t>(1, 256), [&](int64_t i0, int64_t i1) {
        blocks(job.x, job.ldx, nb, i0, i1, bits, out);
    });
    return QuantX{out.q, out.q16, out.scale, out.ssum, out.isum, out.hsum, nb};
}

constexpr int kScalarMR = 4;

// The reference: a block is unpacked once, then every row's terms are added in
// the order and with the roundings every variant uses.
template <int32_t T, int R>
struct ScalarMicro {
    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        constexpr int kP = weight::kPanel;
        const lc_weight& w = *job.packed;
        const int64_t qb = quant::quant_bytes(T);
        float acc[R][kP] = {};
        for (int64_t b = 0; b < qx.nb; ++b) {
            const uint8_t* blk = quant::block_at(w, p, b);
            int u[kP][quant::kBlock];
            float d[kP], m[kP];
            for (int c = 0; c < kP; ++c) {
                for (int e = 0; e < quant::kBlock; ++e) u[c][e] = quant::quant_of(T, blk, c, e);
                uint16_t h;
                std::memcpy(&h, blk + qb + 2 * c, 2);
                d[c] = quant::f16_to_f32(h);
                std::memcpy(&h, blk + qb + 32 + 2 * c, 2);
                m[c] = T == quant::kQ4_1 ? quant::f16_to_f32(h) : 0.0f;
            }
            for (int r = 0; r < R; ++r) {
                const int64_t i = (m0 + r) * qx.nb + b;
                int q[quant::kBlock];
                for (int e = 0; e < quant::kBlock; ++e)
                    q[e] = qx.q16 ? qx.q16[i * quant::kBlock + x16_index(e)]
                                  : qx.q[i * quant::kBlock + e];
                for (int c = 0; c < kP; ++c) {
                    int32_t dot = -quant::offset(T) * qx.isum[i];
                    for (int e = 0; e < quant::kBlock; ++e) dot += u[c][e] * q[e];
                    acc[r][c] = std::fma(float(dot), d[c] * qx.scale[i], acc[r][c]);
                    if (T == quant::kQ4_1) acc[r][c] = std::fma(m[c], qx.ssum[i], acc[r][c]);
                }
            }
        }
        for (int r = 0; r < R; ++r) store_row(job, m0 + r, p * kP, acc[r], nvalid);
    }
};

}  // namespace

void quantize_blocks_scalar(const float* xs, int64_t ldx, int64_t nb, int64_t i0, int64_t i1,
                            int bits, const QuantXOut& out) {
    const bool wide = bits == 16;
    const float qmax = wide ? 32767.0f : 127.0f;
    const long lim = long(qmax);
    for (int64_t i = i0; i < i1; ++i) {
        const float* x = xs + (i / nb) * ldx + (i % nb) * quant::kBlock;
        float amax = 0.0f;  // a NaN is passed over, as the vector max passes it
        for (int e = 0; e < quant::kBlock; ++e) amax = std::max(amax, std::fabs(x[e]));
        const float s = amax / qmax, inv = s != 0.0f ? 1.0f / s : 0.0f;
        int32_t sum = 0, half = 0;
        for (int e = 0; e < quant::kBlock; ++e) {
            if (e == quant::kBlock / 2) half = sum;
            // |v| <= qmax: x[e] * inv <= qmax (+1 ulp); lrint rounds to nearest even
            const long v = std::max(-lim, std::min(lim, std::lrint(x[e] * inv)));
            if (wide)
                out.q16[size_t(i * quant::kBlock + x16_index(e))] = int16_t(v);
            else
                out.q[size_t(i * quant::kBlock + e)] = int8_t(v);
            sum += int32_t(v);
        }
        out.scale[size_t(i)] = s;
        out.isum[size_t(i)] = sum;
        out.hsum[size_t(i)] = half;
        out.ssum[size_t(i)] = s * float(sum);
    }
}

void run_quant_scalar(const Job& job, const QuantX& qx) {
    drive_quant<kScalarMR>(job, [&](int64_t p, int64_t m0, int rows, int nvalid) {
        dispatch_rows<kScalarMR, ScalarMicro>(job.packed->qtype, rows, job, qx, p, m0, nvalid);
    });
}

int quant_activation_bits() { return g_activation_bits.load(std::memory_order_relaxed); }

void set_quant_activation_bits(int bits) {
    if (bits != 8 && bits != 16)
        fail(LC_ERR_INVALID_ARGUMENT, "quantized linear activations are 8 or 16 bits, not " +
                                          std::to_string(bits));
    g_activation_bits.store(bits, std::memory_order_relaxed);
}

void run_quant(const Job& job) {
    thread_local QuantXBuf buf;
    const Isa isa = current_isa();
    static const bool vnni = cpu_has_avx512_vnni();
    const int bits = quant_activation_bits();
    const bool k = quant::kfamily(job.packed->qtype);
    // the workers read this thread's buffer; each variant quantizes with its own ISA
    if (isa >= Isa::kAvx512 && vnni) {
        const QuantX qx = quantize(job, buf, bits, quantize_blocks_avx512);
        if (k)
            run_kquant_avx512(job, qx);
        else if (isa == Isa::kAmx && job.M >= kAmxMinRows && amx_int8_usable())
            run_quant_amx(job, qx);
        else
            run_quant_avx512(job, qx);
    } else if (isa >= Isa::kAvx2) {
        const QuantX qx = quantize(job, buf, bits, quantize_blocks_avx2);
        k ? run_kquant_avx2(job, qx) : run_quant_avx2(job, qx);
    } else {
        const QuantX qx = quantize(job, buf, bits, quantize_blocks_scalar);
        k ? run_kquant_scalar(job, qx) : run_quant_scalar(job, qx);
    }
}

}  // namespace lc::linear

extern "C" lc_status lc_set_quant_activation_bits(int32_t bits) {
    return lc::guard([&] { lc::linear::set_quant_activation_bits(bits); });
}

extern "C" int32_t lc_get_quant_activation_bits(void) {
    return lc::linear::quant_activation_bits();
}

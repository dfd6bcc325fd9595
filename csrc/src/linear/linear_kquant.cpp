// The K family's scalar reference microkernel (linear_kquant.h): a block is
// unpacked once (quants, scales, mins per column), then every row's terms are
// added in the order and with the roundings every variant uses.
#include "linear/linear_kquant.h"

#include <cmath>

namespace lc::linear {
namespace {

constexpr int kMR = 4;

template <int32_t T, int R>
struct Micro {
    static void run(const Job& job, const QuantX& qx, int64_t p, int64_t m0, int nvalid) {
        constexpr int kP = weight::kPanel, H = quant::halves(T), E = quant::kBlock / H;
        const lc_weight& w = *job.packed;
        float acc[R][kP] = {};
        for (int64_t b = 0; b < qx.nb; ++b) {
            const uint8_t *hdr = quant::unit_at(w, p, b), *blk = quant::block_at(w, p, b);
            const int s = int(b % quant::format(T)->subs);
            int u[kP][quant::kBlock];
            float sc[kP][H], mn[kP];
            for (int c = 0; c < kP; ++c) {
                for (int e = 0; e < quant::kBlock; ++e) u[c][e] = quant::kquant_of(T, blk, c, e);
                for (int h = 0; h < H; ++h) sc[c][h] = quant::kscale(T, hdr, s, h, c);
                mn[c] = quant::has_min(T) ? quant::kmin(T, hdr, s, c) : 0.0f;
            }
            for (int r = 0; r < R; ++r) {
                const int64_t i = (m0 + r) * qx.nb + b;
                int q[quant::kBlock];
                for (int e = 0; e < quant::kBlock; ++e)
                    q[e] = qx.q16 ? qx.q16[i * quant::kBlock + x16_index(e)]
                                  : qx.q[i * quant::kBlock + e];
                for (int c = 0; c < kP; ++c) {
                    for (int h = 0; h < H; ++h) {
                        int32_t dot = -quant::koffset(T) * half_isum<H>(qx, i, h);
                        for (int e = h * E; e < (h + 1) * E; ++e) dot += u[c][e] * q[e];
                        acc[r][c] = std::fma(float(dot), sc[c][h] * qx.scale[i], acc[r][c]);
                    }
                    if (quant::has_min(T)) acc[r][c] = std::fma(mn[c], qx.ssum[i], acc[r][c]);
                }
            }
        }
        for (int r = 0; r < R; ++r) store_row(job, m0 + r, p * kP, acc[r], nvalid);
    }
};

}  // namespace

void run_kquant_scalar(const Job& job, const QuantX& qx) {
    drive_quant<kMR>(job, [&](int64_t p, int64_t m0, int rows, int nvalid) {
        dispatch_krows<kMR, Micro>(job.packed->qtype, rows, job, qx, p, m0, nvalid);
    });
}

}  // namespace lc::linear

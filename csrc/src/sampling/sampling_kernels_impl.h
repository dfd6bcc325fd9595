// Bodies of the dense sampler loops. Included once per instruction set by
// sampling_kernels_<isa>.cpp inside its own namespace, under a target pragma,
// so the same source becomes SSE2, AVX2 or AVX-512 code.
//
// The loops use GCC/Clang vector extensions of one native register
// (LC_KERNELS_VBYTES: 16, 32 or 64 bytes): vectorization does not depend on
// the optimizer's mood and needs no -ffast-math. exp and log are polynomial.
// Tails are padded to a full vector, so every element goes through the same
// arithmetic.
//
// The includer defines LC_KERNELS_ISA_NAME (a string) and LC_KERNELS_VBYTES,
// includes <algorithm>, <cfloat>, <cmath>, <cstring>, <immintrin.h> (x86-64),
// common/fast_math.h, rng.h and sampling_kernels.h first, and
// includes this file inside its own namespace. No include guard on purpose.

namespace {

// Helpers pass 64-byte vectors by value: always inline them so that no
// call (and no in-memory vector argument) survives.
#define LC_VINLINE inline __attribute__((always_inline))

// One native register per vector: wider GCC vectors get their comparisons
// split into scalar code.
constexpr int kW = LC_KERNELS_VBYTES / 4;
typedef float vf __attribute__((vector_size(LC_KERNELS_VBYTES)));
typedef int32_t vi __attribute__((vector_size(LC_KERNELS_VBYTES)));
typedef uint32_t vu __attribute__((vector_size(LC_KERNELS_VBYTES)));
typedef uint64_t vu64 __attribute__((vector_size(LC_KERNELS_VBYTES)));
typedef uint16_t vh __attribute__((vector_size(LC_KERNELS_VBYTES / 2)));

constexpr float kInf = INFINITY;

LC_VINLINE vf splat(float x) { return vf{} + x; }
LC_VINLINE vi splati(int32_t x) { return vi{} + x; }
LC_VINLINE vu splatu(uint32_t x) { return vu{} + x; }
LC_VINLINE vf sel(vi mask, vf a, vf b) { return mask ? a : b; }
LC_VINLINE vf as_vf(vi v) { return (vf)v; }
LC_VINLINE vi as_vi(vf v) { return (vi)v; }
LC_VINLINE vu iota() {
    vu r = {};
    for (int j = 0; j < kW; ++j) r[j] = uint32_t(j);
    return r;
}

// hi/lo 32 bits of a * m per lane: even and odd lanes as 64-bit products.
LC_VINLINE void mulhilo(vu a, uint32_t m, vu& hi, vu& lo) {
    const vu64 mm = vu64{} + uint64_t(m);
#if defined(__x86_64__)
    // pmuludq: 32 x 32 -> 64 on the even lanes (the generic multiply below
    // would emulate a full 64 x 64 product).
#if LC_KERNELS_VBYTES == 64
    const vu64 even = (vu64)_mm512_mul_epu32((__m512i)a, (__m512i)mm);
    const vu64 odd = (vu64)_mm512_mul_epu32((__m512i)((vu64)a >> 32), (__m512i)mm);
#elif LC_KERNELS_VBYTES == 32
    const vu64 even = (vu64)_mm256_mul_epu32((__m256i)a, (__m256i)mm);
    const vu64 odd = (vu64)_mm256_mul_epu32((__m256i)((vu64)a >> 32), (__m256i)mm);
#else
    const vu64 even = (vu64)_mm_mul_epu32((__m128i)a, (__m128i)mm);
    const vu64 odd = (vu64)_mm_mul_epu32((__m128i)((vu64)a >> 32), (__m128i)mm);
#endif
#else
    const vu64 even = ((vu64)a & 0xffffffffull) * mm;
    const vu64 odd = ((vu64)a >> 32) * mm;
#endif
    lo = (vu)((even & 0xffffffffull) | (odd << 32));
    hi = (vu)((even >> 32) | (odd & 0xffffffff00000000ull));
}

LC_VINLINE vf loadu(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
LC_VINLINE void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// The first cnt (< kW) values of p, then fill.
LC_VINLINE vf load_part(const float* p, int cnt, float fill) {
    float tmp[kW];
    for (int j = 0; j < kW; ++j) tmp[j] = j < cnt ? p[j] : fill;
    return loadu(tmp);
}
LC_VINLINE void store_part(float* p, vf v, int cnt) {
    float tmp[kW];
    storeu(tmp, v);
    for (int j = 0; j < cnt; ++j) p[j] = tmp[j];
}
LC_VINLINE vf bf16_to_vf(const uint16_t* p) {
    vh h;
    std::memcpy(&h, p, sizeof h);
    return as_vf(vi(__builtin_convertvector(h, vu) << 16));
}

LC_VINLINE bool any_set(vi v) {
    int32_t r = 0;
    for (int j = 0; j < kW; ++j) r |= v[j];
    return r != 0;
}

LC_VINLINE float hmax(vf v) {
    float m = v[0];
    for (int j = 1; j < kW; ++j) m = v[j] > m ? v[j] : m;
    return m;
}

// NaN -> -inf, +inf -> FLT_MAX.
LC_VINLINE vf sanitize(vf v) {
    v = sel(v != v, splat(-kInf), v);
    return sel(v > FLT_MAX, splat(FLT_MAX), v);
}

// exp(x) for x <= 0 (x may be -inf): x = n ln2 + r, |r| <= ln2 / 2, Cephes
// degree-6 polynomial (common/fast_math.h); relative error ~1e-7. exp(x < -87) = 0.
LC_VINLINE vf exp_neg(vf x) {
    namespace fm = lc::fast_math;
    const vi tiny = x < fm::kNegMin;
    const vf xc = sel(tiny, splat(fm::kNegMin), x);
    const vf n = fm::exp_round(xc);
    const vf p = fm::exp_reduced(xc, n);
    const vf scale = as_vf((__builtin_convertvector(n, vi) + 127) << 23);
    return sel(tiny, splat(0.0f), p * scale);
}

// log(u) for positive normal u (Cephes logf, common/fast_math.h).
LC_VINLINE vf log_pos(vf u) {
    const vi b = as_vi(u);
    vf e = __builtin_convertvector((b >> 23) - 127, vf);
    vf m = as_vf((b & 0x007fffff) | 0x3f800000);  // [1, 2)
    const vi big = m > lc::fast_math::kSqrt2;
    m = sel(big, m * 0.5f, m);
    e = sel(big, e + 1.0f, e);
    return lc::fast_math::log_reduced(m - 1.0f, e);
}

// dst[i] = sanitize(get(i)) over [0, n); block_max[b] (when not null) = max of
// block b of kBlockSize values; returns the overall max.
template <class Get>
LC_VINLINE float map_max(Get get, float* dst, int64_t n, float* block_max) {
    constexpr int64_t kB = lc::sampling::kBlockSize;
    vf all = splat(-kInf);
    for (int64_t b = 0; b < n; b += kB) {
        vf acc = splat(-kInf);
        const int64_t end = std::min(n, b + kB);
        int64_t i = b;
        for (; i + kW <= end; i += kW) {
            const vf v = sanitize(get(i, kW));
            storeu(dst + i, v);
            acc = sel(v > acc, v, acc);
        }
        if (i < end) {
            const vf v = sanitize(get(i, int(end - i)));
            store_part(dst + i, v, int(end - i));
            acc = sel(v > acc, v, acc);
        }
        if (block_max) block_max[b / kB] = hmax(acc);
        all = sel(acc > all, acc, all);
    }
    return hmax(all);
}

float load_f32(const float* src, float* dst, int64_t n, float* block_max) {
    return map_max(
        [src](int64_t i, int cnt) {
            return cnt == kW ? loadu(src + i) : load_part(src + i, cnt, -kInf);
        },
        dst, n, block_max);
}

float load_bf16(const uint16_t* src, float* dst, int64_t n, float* block_max) {
    return map_max(
        [src](int64_t i, int cnt) {
            if (cnt == kW) return bf16_to_vf(src + i);
            uint16_t tmp[kW];
            for (int j = 0; j < kW; ++j) tmp[j] = j < cnt ? src[i + j] : uint16_t(0xff80);  // -inf
            return bf16_to_vf(tmp);
        },
        dst, n, block_max);
}

float scale_max(float* x, int64_t n, float temperature, float* block_max) {
    if (temperature == 1.0f) return load_f32(x, x, n, block_max);
    const vf t = splat(temperature);
    return map_max(
        [x, t](int64_t i, int cnt) {
            return (cnt == kW ? loadu(x + i) : load_part(x + i, cnt, -kInf)) / t;
        },
        x, n, block_max);
}

float sum_exp(const float* x, int64_t n, float m) {
    vf acc = splat(0.0f);
    int64_t i = 0;
    for (; i + kW <= n; i += kW) acc += exp_neg(loadu(x + i) - m);
    if (i < n) acc += exp_neg(load_part(x + i, int(n - i), -kInf) - m);
    float s = 0.0f;
    for (int j = 0; j < kW; ++j) s += acc[j];
    return s;
}

int64_t count_greater(const float* x, int64_t n, float v) {
    vi acc = splati(0);  // lanes count at most n / kW < 2^31
    const vf t = splat(v);
    int64_t i = 0;
    for (; i + kW <= n; i += kW) acc -= loadu(x + i) > t;
    if (i < n) acc -= load_part(x + i, int(n - i), -kInf) > t;
    int64_t total = 0;
    for (int j = 0; j < kW; ++j) total += acc[j];
    return total;
}

void apply_bitmask(float* x, int64_t n, const int32_t* words) {
    const vu lane = iota();
    for (int64_t i = 0; i < n; i += kW) {
        const vu bits = splatu(uint32_t(words[i >> 5])) >> (lane + uint32_t(i & 31));
        const vi off = vi((bits & 1u) == 0u);
        const int cnt = int(std::min<int64_t>(kW, n - i));
        if (cnt == kW) {
            storeu(x + i, sel(off, splat(-kInf), loadu(x + i)));
        } else {
            store_part(x + i, sel(off, splat(-kInf), load_part(x + i, cnt, -kInf)), cnt);
        }
    }
}

void bucket_mass(const float* s, int64_t n, float m, float lo, double* mass) {
    const float top = float(lc::sampling::kNumBuckets - 1);
    for (int64_t i = 0; i < n; i += kW) {
        const int cnt = int(std::min<int64_t>(kW, n - i));
        const vf v = cnt == kW ? loadu(s + i) : load_part(s + i, cnt, -kInf);
        const vi keep = v >= lo;
        if (!any_set(keep)) continue;
        const vf w = sel(keep, exp_neg(v - m), splat(0.0f));
        // Same arithmetic as lc::sampling::bucket_of, lane-wise.
        const vf db = sel(keep, (m - v) * lc::sampling::kBucketsPerNat, splat(0.0f));
        const vi inside = db < top;
        const vi b = inside ? __builtin_convertvector(sel(inside, db, splat(0.0f)), vi)
                            : splati(lc::sampling::kNumBuckets - 1);
        for (int j = 0; j < cnt; ++j) mass[b[j]] += w[j];
    }
}

// kW Philox blocks at once (4 * kW consecutive indices), the same arithmetic
// as lc::rng::philox4x32_10. out[t] is the word for index 4 * first_block + t.
LC_VINLINE void philox_group(uint32_t first_block, uint64_t seed, int64_t position,
                             uint32_t* out) {
    const uint64_t pos = uint64_t(position);
    vu c0 = splatu(first_block) + iota(), c1 = splatu(uint32_t(pos)),
       c2 = splatu(uint32_t(pos >> 32)), c3 = splatu(0u);
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += lc::rng::kPhiloxW0;
            k1 += lc::rng::kPhiloxW1;
        }
        vu hi0, lo0, hi1, lo1;
        mulhilo(c0, lc::rng::kPhiloxM0, hi0, lo0);
        mulhilo(c2, lc::rng::kPhiloxM1, hi1, lo1);
        c0 = hi1 ^ c1 ^ k0;
        c2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
    }
    for (int j = 0; j < kW; ++j) {
        out[4 * j + 0] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

lc::sampling::RaceResult race_dense(const float* s, int64_t n, float m, float lo, float scale,
                                    float limit, uint64_t seed, int64_t position) {
    constexpr int kGroup = 4 * kW;  // indices per philox_group call
    lc::sampling::RaceResult best{-1, -1.0f};
    uint32_t bits[kGroup];
    for (int64_t g = 0; g < n; g += kGroup) {
        vf val[4];
        vi keep[4];
        vi any = splati(0);
        for (int q = 0; q < 4; ++q) {
            const int64_t i = g + q * kW;
            const int cnt = int(std::max<int64_t>(0, std::min<int64_t>(kW, n - i)));
            val[q] = cnt == kW ? loadu(s + i) : load_part(s + std::min(i, n), cnt, -kInf);
            // !(d * scale >= limit): a NaN product (inf * 0) keeps the token.
            keep[q] = (val[q] >= lo) & ~((m - val[q]) * scale >= limit);
            any |= keep[q];
        }
        if (!any_set(any)) continue;  // skip the generator for blocks without a candidate
        philox_group(uint32_t(g >> 2), seed, position, bits);
        for (int q = 0; q < 4; ++q) {
            vu b;
            std::memcpy(&b, bits + q * kW, sizeof b);
            const vf u = __builtin_convertvector(b >> 8, vf) * 5.9604644775390625e-8f;
            // u == 0 gives E = +inf and key 0: that token cannot win.
            const vi zero = u == 0.0f;
            const vf e = sel(zero, splat(kInf), -log_pos(sel(zero, splat(1.0f), u)));
            const vf key = sel(keep[q], exp_neg(sel(keep[q], val[q], splat(m)) - m) / e,
                               splat(-1.0f));
            if (!(hmax(key) > best.key)) continue;
            for (int j = 0; j < kW; ++j)
                if (key[j] > best.key) best = {g + q * kW + j, key[j]};
        }
    }
    if (best.key < 0.0f) best.token = -1;
    return best;
}

}  // namespace

#undef LC_VINLINE

const lc::sampling::Kernels kTable = {
    LC_KERNELS_ISA_NAME, load_f32,      load_bf16,   scale_max,  sum_exp,
    count_greater,       apply_bitmask, bucket_mass, race_dense,
};

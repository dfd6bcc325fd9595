// Bodies of the dense sampler loops. Included once per instruction set by
// sampling_kernels_<isa>.cpp inside its own namespace, under a target pragma,
// so the compiler vectorizes the same source for each ISA. Loops work on
// blocks of kLanes independent accumulators so they vectorize without
// -ffast-math; exp and log are polynomial (no libm calls in the loops).
//
// The includer defines LC_KERNELS_ISA_NAME (a string), includes <algorithm>,
// <cfloat>, <cmath>, <cstring>, rng.h and sampling_kernels.h first, and
// includes this file inside its own namespace. No include guard on purpose.

namespace {

constexpr int kLanes = 16;
constexpr float kInf = INFINITY;

inline uint32_t as_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float sanitize(float v) {
    v = v != v ? -kInf : v;
    return v > FLT_MAX ? FLT_MAX : v;
}

// exp(x) for x <= 0 (x may be -inf): Cephes-style range reduction
// x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial; relative error ~1e-7.
inline float exp_neg(float x) {
    const float xc = x < -87.0f ? -87.0f : x;
    const float t = xc * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const float scale = as_float(uint32_t(int32_t(n) + 127) << 23);
    return x < -87.0f ? 0.0f : p * scale;
}

// log(u) for u in (0, 1] (a positive normal float): Cephes logf.
inline float log_pos(float u) {
    const uint32_t b = as_bits(u);
    float e = float(int32_t(b >> 23) - 127);
    float m = as_float((b & 0x007fffffu) | 0x3f800000u);  // [1, 2)
    const bool big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1.0f : e;
    const float f = m - 1.0f;
    const float z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    float y = f * z * p;
    y += e * -2.12194440e-4f;
    y += -0.5f * z;
    return f + y + e * 0.693359375f;
}

template <class Load>
inline float load_max(Load load, float* dst, int64_t n) {
    float acc[kLanes];
    for (int j = 0; j < kLanes; ++j) acc[j] = -kInf;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
            const float v = sanitize(load(i + j));
            dst[i + j] = v;
            acc[j] = v > acc[j] ? v : acc[j];
        }
    float m = -kInf;
    for (; i < n; ++i) {
        const float v = sanitize(load(i));
        dst[i] = v;
        m = v > m ? v : m;
    }
    for (int j = 0; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
    return m;
}

float load_f32(const float* src, float* dst, int64_t n) {
    return load_max([src](int64_t i) { return src[i]; }, dst, n);
}

float load_bf16(const uint16_t* src, float* dst, int64_t n) {
    return load_max([src](int64_t i) { return as_float(uint32_t(src[i]) << 16); }, dst, n);
}

float scale_max(float* x, int64_t n, float temperature) {
    if (temperature == 1.0f) return load_max([x](int64_t i) { return x[i]; }, x, n);
    return load_max([x, temperature](int64_t i) { return x[i] / temperature; }, x, n);
}

float sum_exp(const float* x, int64_t n, float m) {
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += exp_neg(x[i + j] - m);
    float s = 0.0f;
    for (; i < n; ++i) s += exp_neg(x[i] - m);
    for (int j = 0; j < kLanes; ++j) s += acc[j];
    return s;
}

int64_t count_greater(const float* x, int64_t n, float v) {
    int32_t acc[kLanes] = {};
    int64_t total = 0;
    int64_t i = 0;
    // int32 lanes, flushed every 2^20 blocks so they cannot overflow.
    while (i + kLanes <= n) {
        const int64_t end = std::min<int64_t>(n - n % kLanes, i + int64_t(kLanes) * (1 << 20));
        for (; i < end; i += kLanes)
            for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] > v ? 1 : 0;
        for (int j = 0; j < kLanes; ++j) {
            total += acc[j];
            acc[j] = 0;
        }
    }
    for (; i < n; ++i) total += x[i] > v ? 1 : 0;
    return total;
}

void apply_bitmask(float* x, int64_t n, const int32_t* words) {
    int64_t w = 0;
    for (; (w + 1) * 32 <= n; ++w) {
        const uint32_t bits = uint32_t(words[w]);
        float* xw = x + w * 32;
        for (int j = 0; j < 32; ++j) xw[j] = ((bits >> j) & 1u) ? xw[j] : -kInf;
    }
    for (int64_t i = w * 32; i < n; ++i)
        if (!((uint32_t(words[w]) >> (i - w * 32)) & 1u)) x[i] = -kInf;
}

void bucket_mass(const float* s, int64_t n, float m, float lo, double* mass) {
    float w[kLanes];
    int b[kLanes];
    for (int64_t i = 0; i < n; i += kLanes) {
        const int cnt = int(std::min<int64_t>(kLanes, n - i));
        if (cnt == kLanes) {
            for (int j = 0; j < kLanes; ++j) {
                const float v = s[i + j];
                w[j] = v >= lo ? exp_neg(v - m) : 0.0f;
                b[j] = lc::sampling::bucket_of(m - (v >= lo ? v : m));
            }
        } else {
            for (int j = 0; j < cnt; ++j) {
                const float v = s[i + j];
                w[j] = v >= lo ? exp_neg(v - m) : 0.0f;
                b[j] = lc::sampling::bucket_of(m - (v >= lo ? v : m));
            }
        }
        for (int j = 0; j < cnt; ++j) mass[b[j]] += w[j];
    }
}

// Philox over kLanes / 4 consecutive blocks at once; the same arithmetic as
// lc::rng::philox4x32_10, laid out so that the lanes vectorize.
inline void philox_lanes(uint32_t first_block, uint64_t seed, int64_t position,
                         uint32_t* out /* [kLanes] */) {
    constexpr int kBlocks = kLanes / 4;
    uint32_t c0[kBlocks], c1[kBlocks], c2[kBlocks], c3[kBlocks];
    const uint64_t pos = uint64_t(position);
    for (int j = 0; j < kBlocks; ++j) {
        c0[j] = first_block + uint32_t(j);
        c1[j] = uint32_t(pos);
        c2[j] = uint32_t(pos >> 32);
        c3[j] = 0u;
    }
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += lc::rng::kPhiloxW0;
            k1 += lc::rng::kPhiloxW1;
        }
        for (int j = 0; j < kBlocks; ++j) {
            const uint64_t p0 = uint64_t(lc::rng::kPhiloxM0) * c0[j];
            const uint64_t p1 = uint64_t(lc::rng::kPhiloxM1) * c2[j];
            const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[j] ^ k0;
            const uint32_t n2 = uint32_t(p0 >> 32) ^ c3[j] ^ k1;
            c1[j] = uint32_t(p1);
            c3[j] = uint32_t(p0);
            c0[j] = n0;
            c2[j] = n2;
        }
    }
    for (int j = 0; j < kBlocks; ++j) {
        out[4 * j + 0] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

lc::sampling::RaceResult race_dense(const float* s, int64_t n, float m, float lo, float scale,
                                    float limit, uint64_t seed, int64_t position) {
    lc::sampling::RaceResult best{-1, -1.0f};
    uint32_t bits[kLanes];
    float key[kLanes];
    for (int64_t i = 0; i < n; i += kLanes) {
        const int cnt = int(std::min<int64_t>(kLanes, n - i));
        // Skip blocks with no candidate before paying for the generator.
        bool any = false;
        for (int j = 0; j < cnt; ++j) {
            const float v = s[i + j];
            any |= (v >= lo) & ((m - v) * scale < limit);
        }
        if (!any) continue;
        philox_lanes(uint32_t(i >> 2), seed, position, bits);
        for (int j = 0; j < kLanes; ++j) {
            const float v = j < cnt ? s[i + j] : -kInf;
            const bool keep = (v >= lo) & ((m - v) * scale < limit);
            const float u = lc::rng::bits_to_uniform(bits[j]);
            // u == 0 gives E = +inf and key 0: that token cannot win.
            const float e = u > 0.0f ? -log_pos(u) : kInf;
            const float k = exp_neg((keep ? v : m) - m) / e;
            key[j] = keep ? k : -1.0f;
        }
        for (int j = 0; j < cnt; ++j)
            if (key[j] > best.key) best = {i + j, key[j]};
    }
    if (best.key < 0.0f) best.token = -1;
    return best;
}

}  // namespace

const lc::sampling::Kernels kTable = {
    LC_KERNELS_ISA_NAME, load_f32,      load_bf16,   scale_max,  sum_exp,
    count_greater,       apply_bitmask, bucket_mass, race_dense,
};

// The constants of the one exp() approximation every CPU kernel uses:
// x = n ln2 + r (ln2 split in two so n * kLn2Hi is exact), then Cephes' expf
// polynomial of degree 6 in r: exp(r) ~= 1 + r + r^2 (kP0 r^5 + ... + kP5).
// Relative error about 1 ulp for |r| <= ln2 / 2.
#pragma once

namespace lc::exp_poly {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
// The SIMD exp() of attention and the elementwise ops: 0 below kMin (so -inf
// masks become 0), clamped at kMax.
constexpr float kMin = -87.3f;
constexpr float kMax = 88.3f;

}  // namespace lc::exp_poly

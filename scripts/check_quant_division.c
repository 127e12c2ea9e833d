/* Exhaustive CPU check of the division shortcut of csrc/kernels/quantize_numerics.cuh (see the proof
 * there): for every fp32 scale significand S in [2^23, 2^24) and every e4m3 rounding boundary M (all
 * values m/16, m in [16, 32): midpoints between e4m3 neighbours, normal and subnormal, scaled to [1, 2)),
 * every x within 6 ulps of M * s gives the same e4m3 code through
 *     r = RN(1/s), q0 = x * r, e = fma(q0, s, -x), q = fma(-e, r, q0)
 * as through the IEEE quotient. Normal-range scale invariance makes this complete for the normal range;
 * the proof covers the tiny-quotient range. Build: cc -O2 -o /tmp/chk scripts/check_quant_division.c -lm
 * (x86-64 SSE: IEEE fp32 division, fmaf exact; no -ffast-math). Prints the number of mismatches.
 * Note: r must be RN(1/s) exactly. With a neighbour of RN(1/s) instead (what one Newton step from
 * rcp.approx may return) this check does find e4m3 differences, e.g. x = 0x1.c1fffep+0, s = 0x1.1ffffep+0. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint8_t e4m3(float t) { /* RNE, saturating to +-448 (what cvt.rn.satfinite does) */
  uint8_t sign = signbit(t) ? 0x80 : 0;
  float a = fabsf(t);
  if (a >= 448.0f) return sign | 0x7E;
  int e;
  frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
  e -= 1;        /* a in [2^e, 2^(e+1)) */
  if (a == 0.0f || e < -6) {
    float k = rintf(ldexpf(a, 9)); /* subnormal step 2^-9, exact scaling */
    return sign | (uint8_t)k;      /* k == 8 is 2^-6: code 0x08, the smallest normal */
  }
  float m = rintf(ldexpf(a, 3 - e)); /* in [8, 16] */
  int code = ((e + 7) << 3) + ((int)m - 8);
  if (code > 0x7E) code = 0x7E;
  return sign | (uint8_t)code;
}

static float shortcut(float x, float s, float r) {
  float q0 = x * r;
  float e = fmaf(q0, s, -x);
  return fmaf(-e, r, q0);
}

int main(void) {
  long long checked = 0, mismatches = 0, not_rn = 0;
  for (uint32_t S = 1u << 23; S < (1u << 24); ++S) {
    float s;
    uint32_t bits = (127u << 23) | (S & 0x7FFFFFu);
    memcpy(&s, &bits, 4);
    const float r = 1.0f / s; /* RN(1/s): what scale_reciprocal returns */
    for (int m = 16; m < 32; ++m) {
      {
        /* M in [1, 2) suffices: in the normal range x -> 2x scales z, q0, e and q by exactly 2. */
        const float M = (float)m / 16.0f;
        const float center = M * s;
        float x = center;
        for (int k = 0; k < 6; ++k) x = nextafterf(x, 0.0f);
        for (int k = 0; k < 13; ++k, x = nextafterf(x, INFINITY)) {
          for (int sg = 0; sg < 2; ++sg) {
            const float xs = sg ? -x : x;
            const float exact = xs / s;
            const float fast = shortcut(xs, s, r);
            ++checked;
            if (exact == fast) continue;
            ++not_rn;
            if (e4m3(exact) != e4m3(fast)) {
              if (mismatches < 10) printf("mismatch x=%a s=%a exact=%a fast=%a\n", xs, s, exact, fast);
              ++mismatches;
            }
          }
        }
      }
    }
  }
  printf("checked %lld, e4m3 mismatches %lld (fp32 quotients that differ: %lld)\n", checked, mismatches, not_rn);
  return mismatches != 0;
}

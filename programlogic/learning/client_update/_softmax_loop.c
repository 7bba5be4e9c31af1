/* One client's local SGD of a softmax regression, for _softmax_kernel.pyx.
 *
 * The kernel is held transposed, [classes, features], so that both products of a step
 * (the logits, the kernel's gradient) run along contiguous rows. Where GCC can, the
 * function is compiled for AVX-512, for AVX2 with FMA and for the baseline instruction
 * set, and the loader picks the widest the CPU has (the loops over features are most of
 * the work, and vector width was measured to halve their time); setup.py lets it
 * reassociate the sums so that they vectorize. Those builds differ in their last bits.
 *
 * _softmax_loop_baseline.c includes this file with SOFTMAX_BASELINE defined: one build,
 * sums in source order, and exp and log of its own instead of libm's (glibc picks an
 * FMA variant of expf and logf by CPU).
 */
#include "_softmax_loop.h"

#include <math.h>

#if defined(SOFTMAX_BASELINE)
#define WIDEST_VECTORS
#define EXP baseline_expf
#define LOG baseline_logf
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define WIDEST_VECTORS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define EXP expf
#define LOG logf
#else
#define WIDEST_VECTORS
#define EXP expf
#define LOG logf
#endif

#if defined(SOFTMAX_BASELINE)
static const double LN2 = 0.6931471805599453;

/* e^x rounded to float: x = k ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to
 * r^12 / 12! (an error below 1e-13 against float's 6e-8), times 2^k exactly. */
static float baseline_expf(float x) {
    if (isnan(x)) return x;
    if (x > 89.0f) return INFINITY;
    if (x < -104.0f) return 0.0f;
    double k = floor((double)x / LN2 + 0.5), r = (double)x - k * LN2, term = 1.0;
    double total = 1.0;
    for (int n = 1; n <= 12; n++) {
        term = term * r / n;
        total += term;
    }
    return (float)ldexp(total, (int)k);
}

/* ln x rounded to float: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) for
 * s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^17 / 17. */
static float baseline_logf(float x) {
    if (isnan(x) || x < 0.0f) return NAN;
    if (x == 0.0f) return -INFINITY;
    if (isinf(x)) return x;
    int e;
    double m = frexp((double)x, &e);
    if (m < 0.7071067811865476) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, power = s, series = 0.0;
    for (int n = 1; n <= 17; n += 2) {
        series += power / n;
        power *= s2;
    }
    return (float)(e * LN2 + 2.0 * series);
}
#endif

#if defined(SOFTMAX_BASELINE)
#define LANES 8
/* x . row in a fixed order that still vectorizes: LANES running sums, lane j over the
 * features d = j mod LANES below the last multiple of LANES, added up lane by lane, then
 * the features left over one by one. */
static inline float dot(const float *x, const float *row, ptrdiff_t features) {
    float lanes[LANES] = {0.0f};
    ptrdiff_t d = 0;
    for (; d + LANES <= features; d += LANES)
        for (int j = 0; j < LANES; j++) lanes[j] += x[d + j] * row[d + j];
    float total = 0.0f;
    for (int j = 0; j < LANES; j++) total += lanes[j];
    for (; d < features; d++) total += x[d] * row[d];
    return total;
}
#else
/* x . row, reassociated as the compiler vectorizes it. */
static inline float dot(const float *x, const float *row, ptrdiff_t features) {
    float total = 0.0f;
    for (ptrdiff_t d = 0; d < features; d++) total += x[d] * row[d];
    return total;
}
#endif

/* One example's cross-entropy; `out` gets its softmax probabilities and `best` their
 * first largest. A label outside the classes gives NaN (and NaN probabilities). */
static inline float forward(const float *x, int64_t label, const float *kernel,
                            const float *bias, float *out, ptrdiff_t classes,
                            ptrdiff_t features, ptrdiff_t *best) {
    for (ptrdiff_t k = 0; k < classes; k++) out[k] = dot(x, kernel + k * features, features) + bias[k];
    if (label < 0 || label >= classes) {
        *best = -1;
        for (ptrdiff_t k = 0; k < classes; k++) out[k] = NAN;
        return NAN;
    }
    float top = out[0];
    for (ptrdiff_t k = 1; k < classes; k++)
        if (out[k] > top) top = out[k];
    float picked = out[label] - top, norm = 0.0f;
    for (ptrdiff_t k = 0; k < classes; k++) {
        out[k] = EXP(out[k] - top);
        norm += out[k];
    }
    *best = 0;
    for (ptrdiff_t k = 0; k < classes; k++) {
        out[k] = out[k] / norm;
        if (out[k] > out[*best]) *best = k;
    }
    return LOG(norm) - picked;
}

/* The errors of a step's batch (`errors` [slots, classes]: the loss's gradient with
 * respect to each example's logits) and its loss and accuracy sums; returns the number
 * of examples it holds (the sum of its mask). */
static inline float batch_errors(const float *x, const int64_t *labels, const int64_t *indices,
                                 const float *mask, ptrdiff_t slots, ptrdiff_t classes,
                                 ptrdiff_t features, const float *kernel, const float *bias,
                                 float *errors, float *sums) {
    float count = 0.0f;
    for (ptrdiff_t i = 0; i < slots; i++) count += mask[i];
    if (count == 0.0f) return 0.0f;
    float divisor = count > 1.0f ? count : 1.0f, loss_total = 0.0f, correct = 0.0f;
    for (ptrdiff_t i = 0; i < slots; i++) {
        float weight = mask[i], *error = errors + i * classes;
        if (weight == 0.0f) continue;
        int64_t label = labels[indices[i]];
        ptrdiff_t best;
        loss_total += forward(x + indices[i] * features, label, kernel, bias, error, classes,
                              features, &best) * weight;
        if (best == label) correct += weight;
        if (label >= 0 && label < classes) error[label] -= 1.0f;
        for (ptrdiff_t k = 0; k < classes; k++) error[k] = error[k] * weight / divisor;
    }
    sums[0] += loss_total / divisor * count;
    sums[1] += count;
    sums[2] += 1.0f;
    sums[3] += correct;
    sums[4] += count;
    return count;
}

WIDEST_VECTORS
void softmax_train_client(
    const float *x, const int64_t *labels, const int64_t *indices, const float *mask,
    ptrdiff_t slots, ptrdiff_t num_steps, ptrdiff_t classes, ptrdiff_t features,
    float *kernel, float *bias, const float *start_kernel, const float *start_bias,
    float rate, float proximal, float *errors, float *step_sum, float *sums) {
    for (ptrdiff_t step = 0; step < num_steps; step++) {
        const int64_t *batch = indices + step * slots;
        const float *real = mask + step * slots;
        if (batch_errors(x, labels, batch, real, slots, classes, features, kernel, bias,
                         errors, sums) == 0.0f)
            continue;
        for (ptrdiff_t k = 0; k < classes; k++) {
            float *row = kernel + k * features, bias_gradient = 0.0f;
            const float *start = start_kernel + k * features;
            for (ptrdiff_t d = 0; d < features; d++) step_sum[d] = 0.0f;
            for (ptrdiff_t i = 0; i < slots; i++) {
                if (real[i] == 0.0f) continue;
                float error = errors[i * classes + k];
                const float *example = x + batch[i] * features;
                bias_gradient += error;
                for (ptrdiff_t d = 0; d < features; d++) step_sum[d] += error * example[d];
            }
            if (proximal != 0.0f) {
                for (ptrdiff_t d = 0; d < features; d++)
                    step_sum[d] += proximal * (row[d] - start[d]);
                bias_gradient += proximal * (bias[k] - start_bias[k]);
            }
            for (ptrdiff_t d = 0; d < features; d++) row[d] -= rate * step_sum[d];
            bias[k] -= rate * bias_gradient;
        }
    }
}

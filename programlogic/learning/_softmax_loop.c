/* One client's local SGD of a softmax regression, for _softmax_kernel.pyx.
 *
 * The kernel is held transposed, [classes, features], so that both products of a step
 * (the logits, the kernel's gradient) run along contiguous rows. Where GCC can, the
 * function is compiled for AVX-512, for AVX2 with FMA and for the baseline instruction
 * set, and the loader picks the widest the CPU has (the loops over features are most of
 * the work, and vector width was measured to halve their time).
 */
#include "_softmax_loop.h"

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define WIDEST_VECTORS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define WIDEST_VECTORS
#endif

/* One example's cross-entropy; `out` gets its softmax probabilities and `best` their
 * first largest. A label outside the classes gives NaN (and NaN probabilities). */
static inline float forward(const float *x, int64_t label, const float *kernel,
                            const float *bias, float *out, ptrdiff_t classes,
                            ptrdiff_t features, ptrdiff_t *best) {
    for (ptrdiff_t k = 0; k < classes; k++) {
        const float *row = kernel + k * features;
        float total = 0.0f;
        for (ptrdiff_t d = 0; d < features; d++) total += x[d] * row[d];
        out[k] = total + bias[k];
    }
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
        out[k] = expf(out[k] - top);
        norm += out[k];
    }
    *best = 0;
    for (ptrdiff_t k = 0; k < classes; k++) {
        out[k] = out[k] / norm;
        if (out[k] > out[*best]) *best = k;
    }
    return logf(norm) - picked;
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

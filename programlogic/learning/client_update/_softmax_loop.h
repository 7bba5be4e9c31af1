/* One client's local SGD of a softmax regression: see _softmax_loop.c. */
#ifndef PROGRAMLOGIC_SOFTMAX_LOOP_H
#define PROGRAMLOGIC_SOFTMAX_LOOP_H

#include <stddef.h>
#include <stdint.h>

#define SOFTMAX_LOOP_SUMS 5

void softmax_train_client(
    const float *x, const int64_t *labels, const int64_t *indices, const float *mask,
    ptrdiff_t slots, ptrdiff_t num_steps, ptrdiff_t classes, ptrdiff_t features,
    float *kernel, float *bias, const float *start_kernel, const float *start_bias,
    float rate, float proximal, float *errors, float *step_sum, float *sums);

#endif

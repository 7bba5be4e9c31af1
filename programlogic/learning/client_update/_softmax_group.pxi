# The body of _softmax_kernel.pyx and _softmax_kernel_baseline.pyx: one Cython wrapper
# of softmax_train_client, linked to the default or the baseline build of the C loop.

import numpy as np

from libc.math cimport isfinite
from libc.stdint cimport int64_t
from libc.string cimport memcpy

SUMS = ("loss_sum", "num_examples", "num_batches", "correct", "weighed")
"""What :func:`train_group` sums for each client, in the order of its ``sums`` columns."""


cdef extern from "_softmax_loop.h":
    void softmax_train_client(
        const float* x,
        const int64_t* labels,
        const int64_t* indices,
        const float* mask,
        Py_ssize_t slots,
        Py_ssize_t num_steps,
        Py_ssize_t classes,
        Py_ssize_t features,
        float* kernel,
        float* bias,
        const float* start_kernel,
        const float* start_bias,
        float rate,
        float proximal,
        float* errors,
        float* step_sum,
        float* sums,
    ) noexcept nogil


def train_group(
    const float[:, :, ::1] x,
    const int64_t[:, ::1] labels,
    const int64_t[:, :, ::1] indices,
    const float[:, :, ::1] mask,
    Py_ssize_t num_steps,
    const float[:, ::1] kernel,
    const float[::1] bias,
    float rate,
    float proximal,
):
    """Each client's deltas ``start - trained`` (kernels in the model's ``[features,
    classes]``, the transpose of ``kernel``), whether they are finite, and its
    :data:`SUMS`, float32 ``[clients, 5]``.

    ``x`` float32 ``[clients, examples, features]``, ``labels`` int64 ``[clients,
    examples]``, ``indices`` int64 and ``mask`` float32 ``[clients, batches, slots]``;
    the first ``num_steps`` batches are trained on.
    """
    cdef Py_ssize_t clients = x.shape[0], features = x.shape[2]
    cdef Py_ssize_t classes = kernel.shape[0], slots = indices.shape[2]
    cdef Py_ssize_t c, j, k, d, size = classes * features
    if kernel.shape[1] != features or bias.shape[0] != classes:
        raise ValueError("the kernel must be [classes, features] and the bias [classes]")
    if not (labels.shape[0] == indices.shape[0] == mask.shape[0] == clients):
        raise ValueError("x, labels, indices and mask must hold the same clients")
    if num_steps > indices.shape[1] or indices.shape[1] != mask.shape[1]:
        raise ValueError("num_steps must be at most the batches of indices and mask")
    kernel_deltas = np.empty((clients, features, classes), np.float32)
    bias_deltas = np.empty((clients, classes), np.float32)
    finite = np.ones(clients, np.bool_)
    sums = np.zeros((clients, len(SUMS)), np.float32)
    scratch = np.empty(size + classes + slots * classes + features, np.float32)
    cdef float[:, :, ::1] kernel_out = kernel_deltas
    cdef float[:, ::1] bias_out = bias_deltas
    cdef float[:, ::1] sums_out = sums
    cdef float[::1] work = scratch
    cdef float* trained_kernel = &work[0]
    cdef float* trained_bias = &work[size]
    cdef float* errors = &work[size + classes]
    cdef float* step_sum = &work[size + classes + slots * classes]
    cdef unsigned char[::1] finite_out = finite.view(np.uint8)
    with nogil:
        for c in range(clients):
            memcpy(trained_kernel, &kernel[0, 0], size * sizeof(float))
            memcpy(trained_bias, &bias[0], classes * sizeof(float))
            softmax_train_client(
                &x[c, 0, 0], &labels[c, 0], &indices[c, 0, 0], &mask[c, 0, 0], slots,
                num_steps, classes, features, trained_kernel, trained_bias, &kernel[0, 0],
                &bias[0], rate, proximal, errors, step_sum, &sums_out[c, 0],
            )
            for k in range(classes):
                for d in range(features):
                    kernel_out[c, d, k] = kernel[k, d] - trained_kernel[k * features + d]
                    if not isfinite(kernel_out[c, d, k]):
                        finite_out[c] = 0
            for j in range(classes):
                bias_out[c, j] = bias[j] - trained_bias[j]
                if not isfinite(bias_out[c, j]):
                    finite_out[c] = 0
    return kernel_deltas, bias_deltas, finite, sums

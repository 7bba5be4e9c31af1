# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The baseline build of ``_softmax_kernel``: the same :func:`train_group`, its loop
(``_softmax_loop_baseline.c``) adding in a fixed order with its own ``exp`` and ``log``,
so that it gives the same bits on any CPU."""

include "_softmax_group.pxi"

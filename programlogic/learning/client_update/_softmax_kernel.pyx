# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Local SGD of a softmax regression, client by client, compiled at install for the CPU
it runs on (``_softmax_loop.c``).

:func:`train_group` is the loop of :mod:`programlogic.learning.client_update.compiled`:
a group of clients, each from the same start weights, trained on its batches
(``indices`` into its examples, ``mask`` marking the real slots) with the masked mean
cross-entropy and plain SGD, a proximal term when ``proximal`` is nonzero. The kernel
is held transposed, ``[classes, features]``, so that both of a step's products run
along contiguous rows.
"""

include "_softmax_group.pxi"

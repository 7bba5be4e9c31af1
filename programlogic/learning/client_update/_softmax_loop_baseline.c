/* The baseline build of _softmax_loop.c, for _softmax_kernel_baseline.pyx: one
 * instruction set, sums in the order the source writes them (setup.py compiles it without
 * reassociation or contraction), exp and log from basic double operations, so that every
 * IEEE-754 CPU computes the same bits. */
#define SOFTMAX_BASELINE 1
#include "_softmax_loop.c"

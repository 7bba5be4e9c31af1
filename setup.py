"""The compiled part of programlogic: two builds of the softmax regression's local loop.

Everything else is in pyproject.toml. The extensions are optional: where they could not
be built (no C compiler), the install goes on, and ``client_update="auto"`` traces the
same update with TensorFlow instead (``programlogic.learning.client_update``).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

PACKAGE = "programlogic/learning/client_update"

# The default build: reassociation lets the loops over features vectorize; no flag that
# assumes values are finite, since the loop detects a client whose update is not.
FLAGS = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]
# The baseline build: IEEE-754 semantics (no reassociation, no fused multiply-add), so
# that the order of every sum is the source's on any CPU.
BASELINE_FLAGS = ["-O3", "-fno-math-errno", "-ffp-contract=off"]


def kernel(name: str, loop: str, flags: list[str]) -> Extension:
    """An extension of the client-update package; optional (below): without a C
    compiler the install goes on without it."""
    return Extension(
        f"programlogic.learning.client_update.{name}",
        [f"{PACKAGE}/{name}.pyx", f"{PACKAGE}/{loop}"],
        depends=[f"{PACKAGE}/_softmax_group.pxi", f"{PACKAGE}/_softmax_loop.c"],
        extra_compile_args=flags,
    )


extensions = cythonize(
    [
        kernel("_softmax_kernel", "_softmax_loop.c", FLAGS),
        kernel("_softmax_kernel_baseline", "_softmax_loop_baseline.c", BASELINE_FLAGS),
    ],
    compiler_directives={"language_level": 3},
)
for extension in extensions:
    extension.optional = True  # cythonize (Cython 3.3) builds new Extensions without it
setup(ext_modules=extensions)

"""The compiled part of programlogic: the softmax regression's local training loop.

Everything else is in pyproject.toml. The extension is optional: where it could not be
built (no C compiler), the install goes on and the learning processes trace the same
update with TensorFlow instead.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

# Reassociation lets the loops over features vectorize; no flag that assumes values are
# finite, since the loop detects a client whose update is not.
FLAGS = ["-O3", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]

setup(
    ext_modules=cythonize(
        [
            Extension(
                "programlogic.learning._softmax_kernel",
                [
                    "programlogic/learning/_softmax_kernel.pyx",
                    "programlogic/learning/_softmax_loop.c",
                ],
                extra_compile_args=FLAGS,
                # Without a C compiler the install goes on without it.
                optional=True,
            )
        ],
        compiler_directives={"language_level": 3},
    )
)

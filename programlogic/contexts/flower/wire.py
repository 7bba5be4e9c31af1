"""What travels in programlogic's Flower messages: values whose code is named, never shipped.

A message between the ServerApp and a node carries Python values: the client work to
run, its broadcast (model weights), the clients' loaders, and back their results or
errors. They are encoded with :mod:`pickle`, which keeps NumPy arrays, tuples and the
library's own objects as they are, but decoded by an unpickler that resolves code only
as importable references and allows only:

- classes and functions defined in ``programlogic``, ``managers`` or one of the
  packages the decoding side names (the Flower App's own package);
- NumPy's array, dtype and scalar constructors, ``functools.partial``, and the built-in
  scalar, container and exception classes;
- attribute access of non-dunder names (a bound method pickles as one).

Anything else (``os.system``, a lambda's code, ``builtins.eval``, a class of a package
not named) is refused with :class:`RefusedReference` naming it, before any of it runs.
A message therefore never makes a node run code that is not already installed there
and inside the packages it trusts; a value it carries may still call those packages'
functions with the arguments it holds, so a node trusts the ServerApp it connects to
with what those packages do.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import io
import pickle
from collections.abc import Iterable
from typing import Any

__all__ = ["LIBRARY_PACKAGES", "RefusedReference", "decode", "encode"]

LIBRARY_PACKAGES = ("programlogic", "managers")
"""The packages whose code a message may always name."""

_BUILTIN_TYPES = frozenset(
    {"bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list"}
    | {"range", "set", "slice", "str", "tuple"}
)
_NUMPY_CONSTRUCTORS = frozenset(
    {
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
    }
)


class RefusedReference(pickle.UnpicklingError):
    """A message named code outside what its receiver allows."""


def encode(value: Any) -> bytes:
    """``value`` as bytes for a message (pickle protocol 5)."""
    return pickle.dumps(value, protocol=5)


def decode(data: bytes, packages: Iterable[str] = ()) -> Any:
    """The value :func:`encode` gave ``data`` for, resolving code only as the module allows.

    ``packages``: top-level packages (besides :data:`LIBRARY_PACKAGES`) whose classes and
    functions the value may name. Raises :class:`RefusedReference` for any other.
    """
    return _Unpickler(io.BytesIO(data), (*LIBRARY_PACKAGES, *packages)).load()


def _attribute(owner: Any, name: str) -> Any:
    """``getattr`` for pickled bound methods, refusing dunder names."""
    if not isinstance(name, str) or name.startswith("__"):
        raise RefusedReference(f"a message asked for the attribute {name!r}, which is refused")
    return getattr(owner, name)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, packages: tuple[str, ...]) -> None:
        super().__init__(file)
        self._packages = packages

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins":
            if name == "getattr":
                return _attribute
            found = getattr(builtins, name, None)
            if name in _BUILTIN_TYPES or (
                isinstance(found, type) and issubclass(found, BaseException)
            ):
                return found
        elif module == "functools" and name == "partial":
            return functools.partial
        elif (module, name) in _NUMPY_CONSTRUCTORS:
            return super().find_class(module, name)
        elif self._trusted(module) and not any(part.startswith("__") for part in name.split(".")):
            found = importlib.import_module(module)
            for part in name.split("."):
                found = getattr(found, part, None)
            if (isinstance(found, type) or callable(found)) and self._trusted(
                getattr(found, "__module__", "") or ""
            ):
                return found
        raise RefusedReference(
            f"a message named {module}.{name}, which this side refuses: only classes and "
            f"functions of the packages {list(self._packages)} (and NumPy's arrays and the "
            "built-in scalars, containers and exceptions) may travel"
        )

    def _trusted(self, module: str) -> bool:
        return any(module == top or module.startswith(f"{top}.") for top in self._packages)

"""The :mod:`managers` package under the name ``programlogic.managers``.

For programs whose own code has a module named ``managers``: ``from
programlogic.managers import MemoryReleaseManager`` is the same class as ``from managers
import MemoryReleaseManager``, and ``programlogic.managers.state`` is ``managers.state``
(the same module objects, not copies).
"""

import importlib
import pkgutil
import sys

import managers as _managers
from managers import *  # noqa: F403

__all__ = _managers.__all__

for _info in pkgutil.walk_packages(_managers.__path__, prefix="managers."):
    if any(part.startswith("_") for part in _info.name.split(".")):
        continue
    _module = importlib.import_module(_info.name)
    _alias = f"{__name__}.{_info.name.removeprefix('managers.')}"
    sys.modules[_alias] = _module
    if _info.name.count(".") == 1:
        globals()[_info.name.removeprefix("managers.")] = _module

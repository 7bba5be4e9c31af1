"""Backends of the federated context, and the kit for writing one.

``local`` (the embedded default) is imported here. The scale-out and TensorFlow
Federated backends are separate modules, imported on first use, so their optional
dependencies are needed only by programs that use them: ``programlogic.contexts.ray``
(``RayContext``) needs Ray (``pip install 'programlogic[ray]'``); ``programlogic.contexts.tff``
(``TFFContext``, ``TFFLearningProcess``) needs TensorFlow Federated 0.87, which
``scripts/install_tff.sh`` installs.

A new backend subclasses :class:`~programlogic.FederatedContext` and implements its ``run`` and
``stream_units``, cutting a call's clients with :func:`split_units` and computing each
unit with :func:`compute_unit` (see :mod:`programlogic.contexts.units`).
"""

from programlogic.contexts.local import LocalContext
from programlogic.contexts.units import check_group_size, compute_unit, split_units

__all__ = [
    "LocalContext",
    "check_group_size",
    "compute_unit",
    "split_units",
]

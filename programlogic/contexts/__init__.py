"""Backends of the federated context.

``local`` (the embedded default) is imported here. The scale-out and TensorFlow
Federated backends are separate modules, imported on first use, so their optional
dependencies are needed only by programs that use them: ``programlogic.contexts.ray``
(``RayContext``) needs Ray (``pip install 'programlogic[ray]'``); ``programlogic.contexts.tff``
(``TFFContext``, ``TFFLearningProcess``) needs TensorFlow Federated 0.87, which
``scripts/install_tff.sh`` installs.
"""

from programlogic.contexts.local import LocalContext

__all__ = ["LocalContext"]

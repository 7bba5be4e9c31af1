"""The TensorFlow Federated backend: TFF's runtime as a federated context, TFF learning
processes as programlogic learning processes.

Needs TensorFlow Federated 0.87 (Python 3.11, TensorFlow 2.14); ``scripts/install_tff.sh``
builds such an environment with this project in it. Importing this package imports
TensorFlow Federated; ``import programlogic`` never does.
"""

from programlogic.contexts.tff.context import TFFContext
from programlogic.contexts.tff.process import TFFLearningProcess, build_tff_evaluation
from programlogic.contexts.tff.structures import from_plain, to_plain

__all__ = ["TFFContext", "TFFLearningProcess", "build_tff_evaluation", "from_plain", "to_plain"]

#!/usr/bin/env bash
# Builds a Python 3.11 virtual environment with TensorFlow Federated 0.87 (its last release
# on the package index, TensorFlow 2.14, numpy 1.25) and this project installed editable
# into it, for programlogic.contexts.tff and the tests in tests_tff/.
#
# TFF 0.87 pins jax/jaxlib 0.4.14, which the index does not serve. Its TensorFlow code
# paths run with jax/jaxlib 0.4.13, so TFF is installed without dependency resolution on
# top of its other pins, and this project is installed under a constraints file that holds
# every package already in the venv at its version (TFF's typing-extensions and packaging
# pins included), so installing the project never moves TFF's stack.
#
# Usage: scripts/install_tff.sh [VENV_DIR]   (default: .venv-tff in the repository)
# Environment: PYTHON, the interpreter to build the venv with (default python3.11).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$repo/.venv-tff}
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || { echo "install_tff.sh: $py not found (TFF 0.87 needs Python 3.11)" >&2; exit 1; }
version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $version == 3.11 ]] || { echo "install_tff.sh: $py is Python $version, TFF 0.87 needs 3.11" >&2; exit 1; }

if ! { [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import tensorflow_federated' 2>/dev/null; }; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # TFF 0.87's requirements, with jax/jaxlib at 0.4.13 instead of the unserved 0.4.14.
  "$venv/bin/pip" install -q "tensorflow==2.14.*" "absl-py==1.*" "attrs~=23.1" \
    "cachetools~=5.3" "dm-tree==0.1.8" "dp-accounting==0.4.3" "grpcio~=1.46" \
    "jax==0.4.13" "jaxlib==0.4.13" "ml-dtypes==0.2.*" "numpy~=1.25" "portpicker~=1.6" \
    "scipy~=1.9.3" "tensorflow-model-optimization==0.7.5" "tensorflow-privacy==0.9.0" \
    "tqdm~=4.64" "typing-extensions==4.5.*" \
    "googleapis-common-protos==1.61.0"
  "$venv/bin/pip" install -q --no-deps "tensorflow-federated==0.87.0" "google-vizier==0.1.11"
fi

# This project, its test tools and scikit-learn (samples/tff_program.py trains on its
# digits), never moving a package TFF's stack already holds.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$venv/bin/pip" freeze --exclude-editable | grep -v '^-e ' | grep -v ' @ ' >"$constraints"
"$venv/bin/pip" install -q -c "$constraints" -e "$repo" "pytest>=8" "hypothesis>=6.90" "trio>=0.25" \
  scikit-learn
"$venv/bin/python" -c 'import tensorflow_federated as tff, programlogic; print("tff", tff.__version__)' >&2
echo "$venv"

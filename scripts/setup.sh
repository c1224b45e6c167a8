#!/usr/bin/env bash
# Create .venv and install Gyre with its test tools. Torch first: the CPU wheel this machine kind provides when
# there is no NVIDIA GPU, the default (CUDA) build when there is one; an existing torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        .venv/bin/pip install --quiet torch
    else
        .venv/bin/pip install --quiet torch==2.13.0
    fi
fi
.venv/bin/pip install --quiet -e ".[dev]"
# bubblewrap, the default sandbox backend (gyre.sandbox): installed when missing and we are root. Never fatal:
# without it Gyre refuses to start sandboxes and says what to do (install it, or choose sandbox.backend = "local").
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1 ||
            echo "setup: could not install bubblewrap with apt-get; sandboxes need it (or sandbox.backend = \"local\")" >&2
    else
        echo "setup: bwrap not found; install bubblewrap (apt-get install bubblewrap) for sandboxes" >&2
    fi
fi

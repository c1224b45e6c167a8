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
# System packages, each installed with apt-get when missing and we are root (one apt-get update for all). Never fatal:
# - bubblewrap, the default sandbox backend (gyre.sandbox): without it Gyre refuses to start sandboxes and says what
#   to do (install it, or choose sandbox.backend = "local").
# - chromium-headless-shell, the real browser tests/integration/driver opens report.html in (playwright drives it
#   through executable_path; playwright's own browser download is not used); without it that test is skipped.
# - podman (rootful), the container runtime of tasks that name an image (gyre.sandbox.container), with runc and
#   catatonit (`--init`); runc goes first so that it, not crun, fills podman's "crun | runc": crun cannot start
#   containers on hosts with cgroups v1 (this machine kind). Without them tests/integration/sandbox/test_container.py
#   is skipped, saying why. The defaults serve as they are: no configuration of podman's is written.
declare -A why=([bubblewrap]='sandboxes need it (or sandbox.backend = "local")'
                [chromium-headless-shell]="the report's browser test is skipped without it"
                [runc]="podman cannot start containers without it where crun cannot (cgroups v1)"
                [podman]="tasks naming a container image need it (or Docker); the container tests are skipped"
                [catatonit]="podman cannot start the containers of sandboxes (--init) without it")
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
[ -x /usr/lib/chromium/chromium-headless-shell ] || missing+=(chromium-headless-shell)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v podman >/dev/null 2>&1 || missing+=(podman)
[ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || echo "setup: apt-get update failed; installing from the old lists" >&2
        for package in "${missing[@]}"; do
            if ! out=$(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" 2>&1)
            then
                echo "setup: could not install $package with apt-get ($(tail -n 1 <<<"$out")); ${why[$package]}" >&2
            fi
        done
    else
        for package in "${missing[@]}"; do
            echo "setup: $package not installed (apt-get install $package); ${why[$package]}" >&2
        done
    fi
fi

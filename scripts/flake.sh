#!/usr/bin/env bash
# `make flake`: the tests marked `timing` (they pass only if the machine keeps time well enough: liveness, silence,
# heartbeats, timeouts) five times over, beside two CPU hogs, on the suite's two workers: the load CI sees at its
# worst. Run it whenever a timing test or a liveness path changes. More pytest arguments pass through.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
hogs=()
for _ in 1 2; do
    "$PY" -c "while True: pass" &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
"$PY" -m pytest -q -n 2 --dist loadscope --count 5 -m "timing and not gpu" "$@"

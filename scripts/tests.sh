#!/usr/bin/env bash
# `make test` (fast) and `make test-all` (all): the parallel pass (two pytest-xdist workers, a module's tests on one
# worker, modules longest first by tests/durations.json), then the serial pass (tests marked `serial`: they must not
# share the CPU, so they run alone). Both passes always run; the exit status is non-zero if either failed.
# More pytest arguments pass through to both (e.g. --store-durations after a change of the suite).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    fast) tier="not slow and not gpu" ;;
    all) tier="not gpu" ;;
    *) echo "usage: scripts/tests.sh fast|all [pytest arguments]" >&2; exit 2 ;;
esac
shift
PY=.venv/bin/python
"$PY" -m pytest -q -n 2 --dist loadscope --durations=25 -m "($tier) and not serial" "$@"
parallel=$?
# only the modules that mark a test serial are collected again (collecting the whole suite takes ~20 s)
mapfile -t modules < <(grep -rlE "mark\.serial\b" tests --include="test_*.py")
serial=0
if [ "${#modules[@]}" -gt 0 ]; then
    "$PY" -m pytest -q -p no:xdist --durations=10 -m "($tier) and serial" "$@" "${modules[@]}"
    serial=$?
    [ "$serial" -eq 5 ] && serial=0  # this tier has no serial test
fi
echo "parallel pass: exit $parallel; serial pass: exit $serial"
[ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]

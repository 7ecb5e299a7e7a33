#!/usr/bin/env bash
# verl integration tests (tests/trainer_hooks/test_verl.py) in their own virtualenv, .venv-verl:
# verl 0.9.1 pins transformers < 5.11, while the main .venv has TRL with a newer transformers.
# Creates the virtualenv if missing, installs '.[verl-test]' (torch held to the local CPU wheel by
# constraints.txt), refuses a CUDA build, and runs the tests. Extra arguments go to pytest.
# Besides the loss and the Tracking attachment, the tests run real verl 0.9.1 actor updates
# (`trainer_hooks.verl.LLDMonTrainingWorker`: FSDP2 on CPU over gloo, one process, a tiny
# model built in code, nothing downloaded) to check the post-update probe and the anchor set.
#
#   bash scripts/test-verl.sh            # fresh: ~4-5 min (mostly the install), then ~30-40 s
#   bash scripts/test-verl.sh --install-only   # only create/update the virtualenv (CI runs it early,
#                                              # beside the main suite, to overlap the two installs)
#   LLDMON_VERL_VENV=/some/dir bash scripts/test-verl.sh   # keep the virtualenv elsewhere
#
# pip runs only when pyproject.toml, constraints.txt or the checkout's path changed since its last
# successful run (stamp file in the virtualenv). Delete the virtualenv to rebuild it from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${LLDMON_VERL_VENV:-.venv-verl}"
STAMP="$VENV/.lldmon-verl-test.sha256"

quiet_pip() {
  # pip's own warnings about the machine's optional local indexes are noise here.
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" 2>&1 |
    { grep -v -E '^WARNING: Location .* is ignored' || true; }
}

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi

want="$({ cat pyproject.toml constraints.txt; pwd; } | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  quiet_pip -c constraints.txt -e '.[verl-test]'
  if "$VENV/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -q -i -E '^nvidia-'; then
    echo "error: CUDA packages (nvidia-*) were installed into $VENV; torch must stay the CPU wheel" >&2
    exit 1
  fi
  echo "$want" >"$STAMP"
fi

if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi

# Without verl the test module would be skipped, and this script would pass having tested nothing:
# LLDMON_REQUIRE_VERL makes a missing or broken verl an error instead.
LLDMON_REQUIRE_VERL=1 exec "$VENV/bin/python" -m pytest tests/trainer_hooks/test_verl.py tests/trainer_hooks/test_verl_rollback.py -q -p no:cacheprovider -n 0 "$@"

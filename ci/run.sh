#!/usr/bin/env bash
# The README's two set-up commands:
#   bash ci/run.sh demo    install what is needed, then run the main job on the embedded default
#   bash ci/run.sh test    install what is needed, then run both test tiers (fast + real)
# Idempotent: installs only what is missing. Caches live under PATCHKIT_CACHE (~/.cache/patchkit).
set -euo pipefail
cd "$(dirname "$0")/.."

# program -> Debian package; chromium renders report.html in the real tier (headless screenshot,
# tests/real/test_report_html.py): only `test` needs it (132 packages), so `demo` does not install it;
# clang and LLVM's opt measure the operator mutants' trivial compiler equivalence (toolkit/tce.py)
pairs=(git:git cmake:cmake ninja:ninja-build gcc:gcc g++:g++ ccache:ccache)
if [ "${1:-}" = test ]; then pairs+=(chromium:chromium clang++:clang opt:llvm llvm-extract:llvm); fi
need=()
for pair in "${pairs[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing system packages: ${need[*]} (apt-get; a minute or two)" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # -q, not silent: chromium alone takes a minute to unpack, and a silent minute looks like a hang
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" | { grep --line-buffered -E "^(Get|Unpacking|Setting up)" || true; }
fi

PY=${PYTHON:-python3}
# each line as it is written when the output is a pipe (a CI log, `| tee`), not in 8 KiB blocks
export PYTHONUNBUFFERED=1
# installed, with every dependency, and from THIS checkout (not another clone's editable install);
# `demo` needs the package, `test` also its test extra (pytest, hypothesis, actionlint, PyYAML)
here=$(pwd -P)
mods="toolkit, clang.cindex, gguf, git, h11, httpx, jinja2, click, json_source_map, matplotlib, openai"
spec="."
if [ "${1:-}" = test ]; then mods="$mods, pytest, xdist, hypothesis, yaml"; spec=".[test]"; fi
installed=$(cd / && $PY -c "import os, $mods; \
print(os.path.dirname(os.path.dirname(os.path.realpath(toolkit.__file__))))" 2>/dev/null || true)
if [ "$installed" != "$here" ] || ! command -v patchkit >/dev/null 2>&1 \
   || { [ "${1:-}" = test ] && ! command -v actionlint >/dev/null 2>&1; }; then
  echo "==> installing patchkit and its Python dependencies (pip install -e '$spec')" >&2
  # -u and --line-buffered: each line as it happens, not all of them at the end (35 s of silence)
  $PY -u -m pip install --disable-pip-version-check --progress-bar off -e "$spec" \
    | { grep --line-buffered -E "^(Collecting|Installing|Successfully)" || true; }
fi

case "${1:-}" in
  demo) shift; exec patchkit demo "$@" ;;
  # two test processes (PATCHKIT_TEST_WORKERS; 0 runs one): the real tier idles a third of its time
  # waiting on servers; a file's tests stay in one process, so its shared fixtures are made once
  # in the collection's order, the longest files first (tests/conftest.py), not xdist's most-tests-first
  test) shift; exec $PY -m pytest tests -ra -v --durations=30 -n "${PATCHKIT_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@" ;;
  *) echo "usage: bash ci/run.sh demo|test [args]" >&2; exit 2 ;;
esac

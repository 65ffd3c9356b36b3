#!/usr/bin/env bash
# Download, here (with network to PyPI), the wheels Tula's GPU check needs that a GPU machine with
# torch may lack (#25 item 5) -- never torch or torchvision, which the machine has and must keep --
# into .gpu-wheels/ (ignored by git), for manylinux x86_64, at the versions of this checkout's
# .venv (CI's, from constraints.txt) where it has them.  Then carry .gpu-wheels to the GPU machine
# and run bench/gpu_run.sh there; it installs only what that machine lacks.
#
# The Pythons: PY_VERSIONS (default: this machine's and 3.12, the python3 of the lent H100/H200
# machines, /work/.library/device/KINDS.md: Python 3.12.3 with torch 2.11.0 and torchvision 0.26.0,
# numpy, scipy, rich, PyYAML, psutil and typer, but no pydantic or kneed).
#
#   bench/gpu_prepare.sh                         # the small set, for this python and 3.12 (~11 MiB)
#   PY_VERSIONS=3.10 bench/gpu_prepare.sh        # for a machine with another python
#   WITH_NUMPY_SCIPY=1 bench/gpu_prepare.sh      # also numpy and scipy (for the first of PY_VERSIONS;
#                                                # ~52 MiB more: a device run carries 64 MiB in all)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=.gpu-wheels
HOST_PY=${HOST_PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}
HERE_PY=$("$HOST_PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PY_VERSIONS=${PY_VERSIONS:-$(printf '%s\n' "$HERE_PY" 3.12 | awk '!seen[$0]++' | tr '\n' ' ')}
# what tula.core / tula.engine import beyond torch, torchvision and numpy on the paths bench/gpu.py
# runs (its ranks: psutil for the network interface) and the tula CLI; not matplotlib, scikit-learn,
# timm or dask (plots, digits, lars/lamb, Dask), which the check does not reach
NAMES="pydantic pydantic-core annotated-types typing-inspection typing-extensions PyYAML rich
markdown-it-py mdurl Pygments typer click shellingham cloudpickle psutil"
HEAVY="numpy scipy"  # fitting the models needs scipy; torchvision itself needs numpy

pins() {  # NAME==VERSION as installed here, else NAME
    "$HOST_PY" - "$@" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
PY
}

download() {  # PY_VERSION REQUIREMENT...
    local v=$1
    shift
    "$HOST_PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$OUT_DIR" \
        --python-version "$v" --implementation cp --abi "cp${v/./}" --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any "$@"
}

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR"
# shellcheck disable=SC2086  # one name per word
small=$(pins $NAMES)
for v in $PY_VERSIONS; do
    # shellcheck disable=SC2086
    download "$v" $small
done
if [ "${WITH_NUMPY_SCIPY:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    download "${PY_VERSIONS%% *}" $(pins $HEAVY)
fi
if ls "$OUT_DIR" | grep -qiE '^(torch|torchvision|nvidia|triton)'; then
    echo "bench/gpu_prepare.sh: a torch wheel got into $OUT_DIR; it must not be carried" >&2
    exit 1
fi
size_mib=$(du -sm "$OUT_DIR" | cut -f1)
echo "$(ls "$OUT_DIR" | wc -l) wheels for CPython ${PY_VERSIONS% } in $OUT_DIR: ${size_mib} MiB"
if [ "$size_mib" -gt 56 ]; then
    echo "bench/gpu_prepare.sh: note: $OUT_DIR is ${size_mib} MiB; a device run carries at most 64 MiB with the project" >&2
fi

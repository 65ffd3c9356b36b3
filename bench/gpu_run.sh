#!/usr/bin/env bash
# The GPU check on a GPU machine (#25 item 5), from the root of a copy of the project with the
# wheels bench/gpu_prepare.sh made (.gpu-wheels): the packages the machine lacks are put into
# .gpu-site from those wheels -- no index, no dependencies resolved, nothing the machine has
# replaced (its torch least of all) -- then bench/gpu.py runs with src and .gpu-site on the path,
# within $TULA_GPU_TIMEOUT_S (default 300) seconds.  Arguments go to bench/gpu.py.  Where $OUT is
# set (a device run's folder that comes back), the updated docs/benchmarks-history.md and the log go there.
#
#   bench/gpu_run.sh                 # ResNet-50/224, fp32 bf16 fp16, b 32..256
#   bench/gpu_run.sh --tf32          # the same with train.tf32 in both loops
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
WHEELS=.gpu-wheels
SITE=.gpu-site
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "bench/gpu_run.sh: no wheels in $WHEELS; run bench/gpu_prepare.sh first and carry $WHEELS" >&2
    exit 2
fi
if ! "$PY" -c "import torch, torchvision" 2>/dev/null; then
    echo "bench/gpu_run.sh: $PY cannot import torch and torchvision; the GPU check uses the machine's own" >&2
    exit 2
fi
rm -rf "$SITE"
mkdir -p "$SITE"
# the wheels (one per distribution: the one for this python) whose distribution this interpreter
# lacks; pydantic 1 counts as lacking pydantic 2
missing=$("$PY" - "$WHEELS" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

here = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def fits(py: str, abi: str) -> bool:
    if abi == "abi3":  # the stable ABI: any CPython at or above the tag's
        return all(t.startswith("cp") and int(t[2:]) <= int(here[2:]) for t in py.split("."))
    return any(t == here or t.startswith("py") for t in py.split("."))


by_name: dict[str, list[Path]] = {}
for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    by_name.setdefault(whl.name.split("-")[0].lower(), []).append(whl)
for name, wheels in sorted(by_name.items()):
    try:
        have = version(name.replace("_", "-"))
    except PackageNotFoundError:
        have = None
    if have is not None and not (name in ("pydantic", "pydantic_core") and have.split(".")[0] in ("0", "1")):
        continue
    usable = [w for w in wheels if fits(*w.stem.split("-")[-3:-1])]
    if not usable:
        sys.exit(f"bench/gpu_run.sh: this python ({here}) lacks {name} and {sys.argv[1]} has no wheel of it for "
                 f"{here}; run PY_VERSIONS={sys.version_info[0]}.{sys.version_info[1]} bench/gpu_prepare.sh")
    print(usable[0])
PY
) || exit 2
if [ -n "$missing" ]; then
    echo "installing into $SITE: $(echo "$missing" | xargs -n1 basename | tr '\n' ' ')"
    # shellcheck disable=SC2086
    if ! "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" $missing 2>/dev/null; then
        "$PY" - "$SITE" $missing <<'PY' || exit 2
import sys, zipfile  # no pip here: a wheel is a zip of what goes into site-packages
for whl in sys.argv[2:]:
    zipfile.ZipFile(whl).extractall(sys.argv[1])
PY
    fi
fi
export PYTHONPATH="$PWD/src:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
LOG=$(mktemp)
timeout "${TULA_GPU_TIMEOUT_S:-300}" "$PY" bench/gpu.py "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    cp docs/benchmarks-history.md "$LOG" "$OUT/" 2>/dev/null && mv "$OUT/$(basename "$LOG")" "$OUT/gpu_check.log"
fi
[ "$rc" = 124 ] && echo "bench/gpu_run.sh: the GPU check ran past ${TULA_GPU_TIMEOUT_S:-300} s and was stopped" >&2
exit "$rc"

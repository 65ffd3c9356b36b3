"""What the service accepts: a spec valid by the CLI's own rules, within the service's limits,
importing code and reading data only where the settings allow.  No torch here.

Each refusal is a :class:`~tula.core.errors.SpecError` whose one sentence names the field; the
web layer answers it with 422.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from tula.core.errors import SpecError
from tula.core.registry import CLUSTERS, OBJECTIVE_NAMES, cluster_kind
from tula.core.say import fmt_bytes
from tula.core.spec import JobSpec, in_memory_data_bytes, spec_from_dict
from tula.service.settings import ServiceSettings

SEARCHES = ("full", "partial")


#: the deepest nesting of lists and mappings a request body may have (a spec is about 4 deep)
MAX_BODY_DEPTH = 64


def parse_spec_text(text: str) -> Any:
    """A spec sent as YAML (JSON is YAML too); not a mapping is one sentence."""
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise SpecError(too_deep()) from None
    except (yaml.YAMLError, ValueError) as err:
        raise SpecError(f"the request body is not valid YAML or JSON ({str(err).splitlines()[0]})") from None
    return check_depth(data)


def parse_json_body(text: str) -> Any:
    """A JSON request body; not JSON, or nested deeper than :data:`MAX_BODY_DEPTH`, is one sentence."""
    try:
        data = json.loads(text)
    except RecursionError:  # deeper than the parser's own recursion: far deeper than the limit
        raise SpecError(too_deep()) from None
    except ValueError as err:
        raise SpecError(f"the request body is not valid JSON ({err})") from None
    return check_depth(data)


def too_deep() -> str:
    return (
        f"the request body nests lists and objects more than {MAX_BODY_DEPTH} levels deep, more than this service reads"
    )


def check_depth(value: Any) -> Any:
    """``value``, when its lists and mappings nest at most :data:`MAX_BODY_DEPTH` deep (walked
    without recursion), else a :class:`SpecError`."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth + 1 > MAX_BODY_DEPTH:
                raise SpecError(too_deep())
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return value


def search_space_size(spec: JobSpec) -> int:
    """An upper bound of the (N, B) configurations the search may plan over, without the data
    set: cluster sizes x global batches from min_batch up to max_batch by batch_growth (to
    2^30 when max_batch is unset; the data set caps it further)."""
    s = spec.search
    hi = s.max_batch or (1 << 30)
    batches = int(math.floor(math.log(hi / s.min_batch, s.batch_growth) + 1e-9)) + 1
    return len(s.cluster_sizes) * batches


def admit(spec_data: Any, settings: ServiceSettings) -> JobSpec:
    """The checked spec of a submission, or a :class:`SpecError` naming the field."""
    spec = spec_from_dict(spec_data)
    if spec.epochs > settings.max_epochs:
        raise SpecError(f"spec field 'epochs' is {spec.epochs}, above this service's limit of {settings.max_epochs}")
    n = search_space_size(spec)
    if n > settings.max_configs:
        raise SpecError(
            f"spec field 'search' allows up to {n} configurations ({len(spec.search.cluster_sizes)} "
            f"cluster sizes x batches {spec.search.min_batch}..{spec.search.max_batch or 'the data set'}), "
            f"above this service's limit of {settings.max_configs}"
        )
    held = in_memory_data_bytes(spec.data)
    if held is not None and held > settings.max_data_bytes:
        raise SpecError(
            f"spec field 'data' describes a {spec.data.name} set of {fmt_bytes(held)} in memory, above this "
            f"service's limit of {fmt_bytes(settings.max_data_bytes)} (TULA_MAX_DATA_BYTES); use fewer or smaller samples"
        )
    name = spec.model.name
    # the user's code: a model factory, a data factory, a loss, a step class -- imported only from allowed modules
    imports = {
        "model.name": name,
        "data.factory": spec.data.factory,
        "train.loss": spec.train.loss,
        "train.step": spec.train.step,
        "optimizer.name": spec.optimizer.name,
    }
    for field, path in imports.items():
        if path is not None and path.startswith("pickle:"):
            what = {"train.loss": "object", "train.step": "class"}.get(field, "factory")
            raise SpecError(
                f"spec field {field!r} is a pickled {what}, which runs code when it is loaded; the "
                "service accepts Tula's built-ins, torchvision names and import paths on its allow-list"
            )
    for field, path in imports.items():
        if path is not None and ":" in path:
            _check_import(field, path, settings)
    for field in ("root", "path"):  # sets read from disk: only under the allowed directories
        given = getattr(spec.data, field, None)
        if given is None:
            continue
        p = Path(given).expanduser()
        resolved = p.resolve() if p.is_absolute() else None
        if resolved is None or not any(resolved.is_relative_to(Path(r).resolve()) for r in settings.data_roots):
            allowed = ", ".join(str(r) for r in settings.data_roots) or "none"
            raise SpecError(
                f"spec field 'data.{field}' is {given!r}, not under a data directory this service "
                f"allows (allowed: {allowed}; set TULA_DATA_ROOTS)"
            )
    for i, entry in enumerate(spec.train.loggers):  # a job's sinks write into its own directory only
        for field in ("dir", "tracking_uri"):
            if getattr(entry, field, None) is not None:
                raise SpecError(
                    f"spec field 'train.loggers.{i}.{field}' is set, but the service writes a job's metrics sinks "
                    "into the job's own directory (or the MLflow server the operator sets in MLFLOW_TRACKING_URI); "
                    f"leave {field} out"
                )
    if not cluster_kind(spec.cluster.where).submittable:
        allowed = " or ".join(k.name for k in CLUSTERS.values() if k.submittable)
        raise SpecError(
            f"spec field 'cluster.where' is {spec.cluster.where!r}; the service runs jobs on its own "
            f"launcher ({allowed}), not on a cluster a submission names"
        )
    return spec


def _check_import(field: str, path: str, settings: ServiceSettings) -> None:
    """``path`` (``package.module:attribute``, named by spec field ``field``) may be imported
    only when its module or its top-level package is on the allow-list."""
    module = path.partition(":")[0]
    top = module.split(".")[0]
    if top not in settings.import_allowlist and module not in settings.import_allowlist:
        allowed = ", ".join(settings.import_allowlist) or "none"
        raise SpecError(
            f"spec field '{field}' imports {module!r}, which is not on this service's import "
            f"allow-list (allowed: {allowed}; set TULA_IMPORT_ALLOWLIST)"
        )


def check_options(search: Any, objective: Any, train: Any) -> tuple[str, str | None, bool]:
    """The pipeline options of a submission."""
    if search not in SEARCHES:
        raise SpecError(f"field 'search' is {search!r}, but it must be one of {', '.join(SEARCHES)}")
    if objective is not None and objective not in OBJECTIVE_NAMES:
        raise SpecError(f"field 'objective' is {objective!r}, but it must be one of {', '.join(OBJECTIVE_NAMES)}")
    if not isinstance(train, bool):
        raise SpecError(f"field 'train' is {train!r}, but it must be true or false")
    return search, objective, train

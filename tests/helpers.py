"""Test scaffolding shared by the test modules: plain functions, no fixtures (those are in
conftest.py).  A test module imports what it needs from here, never from another test module.

- the tests' job (:func:`tiny_spec`) and a spec written to a file (:func:`write_spec`);
- running ``tula``: as the installed command (:func:`run_tula`, :func:`popen_tula`) or in this
  process through the same entry point (:func:`tula_in_process`); the check that a refusal is
  exit 2 with one sentence and no traceback (:func:`assert_refused`); the arguments of the
  tests' usual ``tula train`` (:func:`train_args`); a kill on a line of a command's log
  (:func:`kill_on_line`); ``python -c`` in a fresh interpreter (:func:`run_python`) and the
  check that modules load no torch there (:func:`assert_imports_no_torch`);
- :func:`free_port`;
- /proc walkers: :func:`process_tree`, :func:`descendants`, :func:`ranks_below`,
  :func:`group_alive`, :func:`pids_with`, :func:`cmdline`, :func:`argv`;
- the local launcher of a test (:func:`local_launcher`), a run trained in two halves
  (:func:`train_in_two`) and the check that two runs ended with the same model
  (:func:`assert_same_model`);
- records made by hand: :func:`profile_record` (of :func:`known_trials`, known step times and
  peaks, or of given trials, e.g. :func:`noisy_trials` of a performance model),
  :func:`models_record` (a models record of a known performance model and :func:`memory_model`);
  a training run's epochs and record, whole and checked: :func:`epoch`, :func:`train_record`;
- damaged input for hypothesis: :func:`json_values`, :func:`other_types`,
  :func:`mutation_site`, :func:`damaged_bytes`.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tula.core.records import EpochRecord, TrainRecord

HERE = Path(__file__).resolve().parent
#: the checkout
ROOT = HERE.parent


# --------------------------------------------------------------------------- the tests' job
def tiny_spec(profile: bool = True) -> dict:
    """A job small enough for 2-rank trials in a few seconds (a new dict at each call; the
    ``tiny_spec_dict`` fixture).  ``profile``: with its profile section (short trials)."""
    spec = {
        "name": "tiny",
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
        "data": {"name": "digits"},
        "epochs": 2,
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256},
    }
    if profile:
        spec["profile"] = {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0}
    return spec


def write_spec(folder: Path, spec: dict, name: str = "spec.yaml") -> Path:
    """``spec`` (a dict) written as YAML to ``folder / name``, which is returned."""
    import yaml

    path = Path(folder) / name
    path.write_text(yaml.safe_dump(spec))
    return path


# --------------------------------------------------------------------------- running tula
def env_with_tests(*folders: Path) -> dict:
    """This process's environment with tests/ (and ``folders``) on the import path of a command
    and of every rank it starts (a spec that names ``factories:...`` or ``workers:...``)."""
    path = [str(HERE), *map(str, folders), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def tula_cmd() -> list[str]:
    """The installed ``tula`` command (or ``python -m tula.cli`` where none is installed)."""
    exe = Path(sys.executable).parent / "tula"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tula.cli"]


def run_tula(*args: Any, timeout: float = 600, columns: int | None = None, **kw: Any) -> subprocess.CompletedProcess:
    """``tula ARGS`` as a user runs it: a process of its own, output captured as text.
    ``columns``: the terminal width its output is laid out for (COLUMNS, which rich reads),
    so that a long line is not wrapped."""
    if columns is not None:
        kw["env"] = {**kw.get("env", os.environ), "COLUMNS": str(columns)}
    return subprocess.run([*tula_cmd(), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def train_args(spec: Any, out: Any, *more: Any, method: str | None = "lbt", workers: Any = 2, batch: Any = 64) -> list:
    """The arguments of ``tula train SPEC --method M --workers N --batch B --out OUT MORE...``
    (by default the tests' 2-rank LBT run at 64; ``method`` or ``workers`` None: left out)."""
    how = ([] if method is None else ["--method", method]) + ([] if workers is None else ["--workers", workers])
    return ["train", spec, *how, "--batch", batch, "--out", out, *more]


def popen_tula(*args: Any, prefix: tuple[str, ...] = (), **kw: Any) -> subprocess.Popen:
    """``tula ARGS`` started and left running: stdout discarded, stderr a text pipe, its own
    process group (so that a signal to the group reaches its ranks too) unless ``kw`` says
    otherwise.  ``prefix``: what runs it (e.g. ``ip netns exec NS``)."""
    kw = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True, "start_new_session": True, **kw}
    return subprocess.Popen([*prefix, *tula_cmd(), *map(str, args)], **kw)


def kill_on_line(proc: subprocess.Popen, start: str, kill: Callable[[int, int], None] = os.kill) -> list[str]:
    """Read ``proc``'s stderr (a text pipe) up to the first line that starts with ``start``,
    then SIGKILL it with ``kill`` (``os.killpg``: its process group, ranks and all) and wait
    for it (at most 60 s).  Returns the lines read, that one last (all of them if none did)."""
    seen = []
    try:
        for line in proc.stderr or ():
            seen.append(line)
            if line.startswith(start):
                kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=60)
    return seen


@dataclass
class Result:
    """What a command left: its exit code and its output, as :class:`subprocess.CompletedProcess` names them."""

    returncode: int
    stdout: str
    stderr: str


def tula_in_process(
    *args: Any,
    path: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
) -> Result:
    """``tula ARGS`` run in this process through the command's own entry point
    (``tula.cli.main``: the same parsing, the same handling of errors into one sentence and an
    exit code), its stdout and stderr captured.  ``path``: folders put first on the import path
    for the command and its ranks (user code), and the modules imported from them forgotten
    afterwards (tests/ is on it already).  ``env``: variables set for the command and the
    ranks it starts, and put back afterwards.  ``cwd``: the directory it runs in.  ``timeout``:
    seconds after which a TimeoutError is raised in the command (SIGALRM), as :func:`run_tula`'s
    timeout ends a command that hangs, so that it ends as a failure and its ranks are stopped.

    A command that starts ranks may run here as well: its ranks are real processes, forked
    from this process's fork server (started by the first such command, then shared, as it is
    shared by a command's worlds), which spares each command about 7 s of CPU that a process of
    its own spends importing torch twice (README, "make test").  What stays in a process of its own
    (:func:`run_tula`): a test about the process -- signals, exit by signal, the entry point --,
    about what ranks print themselves (their stdout and stderr are this process's, not
    captured here), about the terminal's width, or a command under ``--cluster env``."""
    from tula import cli

    out, err = io.StringIO(), io.StringIO()
    argv, sys_path, modules, environ, here = sys.argv, list(sys.path), set(sys.modules), dict(os.environ), os.getcwd()
    sys.argv = ["tula", *map(str, args)]
    sys.path[:0] = [str(p) for p in path]
    os.environ.update(env or {})

    def _too_long(signum: int, frame: Any) -> None:
        raise TimeoutError(f"tula {' '.join(map(str, args))} did not end within {timeout:g} s")

    alarm = signal.signal(signal.SIGALRM, _too_long)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as ex:
                code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv, sys.path[:] = argv, sys_path
        if path:
            for name in set(sys.modules) - modules:
                origin = getattr(sys.modules[name], "__file__", None) or ""
                if any(origin.startswith(str(p)) for p in path):
                    del sys.modules[name]
    return Result(code, out.getvalue(), err.getvalue())


def one_line(text: str) -> str:
    """``text`` with its whitespace runs made single spaces (rich wraps long lines)."""
    return " ".join(text.split())


def assert_refused(r: Any, sentence: str, code: int = 2) -> str:
    """``r`` (a :class:`Result` or a CompletedProcess) is a refusal: exit ``code``, stderr is one
    ``error:`` sentence holding ``sentence`` and nothing else -- no traceback, no progress bar,
    nothing on stdout.  Returns that sentence on one line."""
    err = one_line(r.stderr)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert sentence in err, err
    assert err.startswith("error: ") and err.count("error:") == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr and 'File "' not in r.stderr, r.stderr
    assert "━" not in r.stderr and r.stdout.strip() == "", (r.stdout, r.stderr)
    return err


def run_python(code: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess:
    """``python -c CODE`` in a fresh interpreter (this one's), output captured as text."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, **kw)


def assert_imports_no_torch(*modules: str) -> None:
    """Importing ``modules`` in a fresh interpreter loads neither torch nor any torch.* module."""
    code = (
        f"import sys, {', '.join(modules)}; "
        "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
        "assert not loaded, f'torch was imported: {loaded[:5]}'"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- ports and processes
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def argv(pid: int) -> list[str]:
    """The arguments of ``pid`` as it was started ([] once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0")[:-1]]
    except OSError:
        return []


def comm(pid: int) -> str:
    """The process name of ``pid`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def process_tree() -> dict[int, list[int]]:
    """Every live (not zombie) process by its parent, whichever of the parent's threads started it."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(d))
    return children


def pids_with(*args: str) -> list[int]:
    """The live (not zombie) processes whose arguments include each of ``args``."""
    return sorted(p for ps in process_tree().values() for p in ps if set(args) <= set(argv(p)))


def descendants(pid: int, keep_helpers: bool = False) -> list[int]:
    """Every live process below ``pid``; without ``keep_helpers``, not multiprocessing's
    resource tracker nor the local launcher's fork server (one each per process that started
    ranks, kept for its lifetime by design; the ranks forked from the server are named tula-rank-R)."""
    children = process_tree()
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            todo.append(c)
            line = cmdline(c)
            if not keep_helpers and "resource_tracker" in line:
                continue
            if not keep_helpers and "multiprocessing.forkserver" in line and not comm(c).startswith("tula-rank-"):
                continue
            out.append(c)
    return out


def ranks_below(pid: int) -> list[int]:
    """The rank processes (named tula-rank-R) below ``pid``."""
    return [p for p in descendants(pid, keep_helpers=True) if comm(p).startswith("tula-rank-")]


def group_alive(pgid: int, wait_s: float = 5.0) -> list[str]:
    """Command lines of processes still in group ``pgid`` after up to ``wait_s`` (helpers such
    as multiprocessing's resource tracker exit a moment after their parent)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.getpgid(int(pid)) == pgid:
                        alive.append(cmdline(int(pid))[:120])
                except (ProcessLookupError, OSError):
                    pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


# --------------------------------------------------------------------------- launching
def local_launcher(**kw: Any):
    """The local launcher the tests train with: CPU, one thread per rank."""
    from tula.engine.launch import LocalLauncher

    return LocalLauncher(**{"device": "cpu", "threads_per_worker": 1, **kw})


def train_in_two(d: dict, method: str, n_workers: int, batch: int, out: Path, launcher: Any) -> TrainRecord:
    """The job ``d`` (a spec dict) trained for one epoch into ``out``, then resumed there to
    its ``epochs``; returns the resumed run's record."""
    from tula.core.spec import spec_from_dict
    from tula.engine.train import train

    train(spec_from_dict({**d, "epochs": 1}), method, n_workers, batch, out, launcher=launcher)
    return train(spec_from_dict(d), method, n_workers, batch, out, resume=True, launcher=launcher)


def assert_same_model(a: Path, b: Path) -> None:
    """The checkpoints of the runs in ``a`` and ``b`` hold the same parameters, bit for bit."""
    import torch

    from tula.engine.checkpoint import load_checkpoint

    ma, mb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma), (a, b)


# --------------------------------------------------------------------------- records made by hand
def known_trials() -> list[dict]:
    """Trials of known step times and peaks (no torch involved): N in (1, 2), B in
    (16, 32, 128, 256), t_compute = 1 ms + 10 us * b, 2 ms of sync on 2 workers, a peak of
    100,000 bytes + 2,000 per sample."""
    trials = []
    for n in (1, 2):
        for big_b in (16, 32, 128, 256):
            b = big_b // n
            t_compute = 1e-3 + 1e-5 * b
            t_step = t_compute + (2e-3 if n > 1 else 0.0)
            trials.append(
                {
                    "n_workers": n,
                    "local_batch": b,
                    "global_batch": big_b,
                    "status": "ok",
                    "t_step_s": t_step,
                    "t_compute_s": t_compute,
                    "t_sync_s": t_step - t_compute,
                    "peak_mem_bytes": 100_000 + 2_000 * b,
                    "step_times_s": [t_step] * 3,
                    "compute_times_s": [t_compute] * 3,
                    "timed_steps": 3,
                }
            )
    return trials


def noisy_trials(truth: Any, worlds, batches, noise: float, seed: int) -> list[dict]:
    """Trials whose step times come from the performance model ``truth`` with multiplicative
    normal noise (t_compute drawn before t_step, trial by trial), local batches ``batches`` in
    each world.  A world is a worker count (the flat model) or the hosts of its ranks, e.g.
    ``["h0", "h0", "h1"]`` (``[]``: one rank on h0), which the trial records."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for world in worlds:
        hosts = None if isinstance(world, int) else (world or ["h0"])
        n = world if hosts is None else len(hosts)
        per = n if hosts is None else max(hosts.count(h) for h in hosts)
        for b in batches:
            if hosts is None:
                tc = float(truth.t_compute_s(b, n)) * (1 + noise * rng.standard_normal())
                ts = float(truth.t_step_s(b, n)) * (1 + noise * rng.standard_normal())
            else:
                tc = float(truth.t_compute_s(b, min(n, per))) * (1 + noise * rng.standard_normal())
                ts = float(truth.t_step_s(b, n, per, len(set(hosts)))) * (1 + noise * rng.standard_normal())
            trial = {
                "n_workers": n,
                "local_batch": b,
                "global_batch": n * b,
                "status": "ok",
                "t_step_s": ts,
                "t_compute_s": tc,
            }
            if hosts is not None:
                trial.update(
                    hosts=list(hosts),
                    ranks_per_host=per,
                    local_ranks=[hosts[:i].count(h) for i, h in enumerate(hosts)],
                )
            out.append(trial)
    return out


def typed_trials(trials: list[dict]) -> list:
    """``trials`` (dicts, as a profile record's JSON holds them) as :class:`tula.core.trial.Trial`
    objects, checked as the records check them: what the fitting functions take."""
    from pydantic import TypeAdapter

    from tula.core.trial import Trial

    return TypeAdapter(list[Trial]).validate_python(trials)


def profile_record(spec: dict, trials: list[dict] | None = None, **fields: Any) -> dict:
    """A profile record as ``tula profile`` writes it (not validated): of ``trials``
    (:func:`known_trials` unless given) with a memory probe that matches those, the digits set
    (1438 samples of 1x8x8) and small_cnn.  ``fields`` replace top-level fields (``memory``,
    ``model``, ``search``, ``created``, ``facts``, ...); ``configs`` are the trials' (N, B)."""
    trials = known_trials() if trials is None else trials
    memory = {
        "param_bytes": 40_000,
        "grad_bytes": 40_000,
        "optimizer_state_bytes": 10_000,
        "buffer_bytes": 0,
        "other_static_bytes": 10_000,
        "activation_bytes_per_sample": 1_900,
        "batch_bytes_per_sample": 100,
        "probe_local_batches": [16, 32],
        "probe_peak_bytes": [132_000, 164_000],
        "device": "cpu",
    }
    return {
        "kind": "tula.profile",
        "version": 1,
        "spec": spec,
        "search": "full",
        "device": "cpu",
        "backend": "gloo",
        "threads_per_worker": 1,
        "memory_budget_bytes": None,
        "enforce_memory_cap": False,
        "dataset_size": 1438,
        "sample_shape": [1, 8, 8],
        "model": {"name": "small_cnn", "param_count": 10_000, "grad_bytes": 40_000},
        "memory": memory,
        "max_local_batch": None,
        "configs": [[t["n_workers"], t["global_batch"]] for t in trials],
        "trials": trials,
        "profiling_s": 1.0,
        "created": "now",
        **fields,
    }


def memory_model(**fields: Any):
    """The memory model of the records made by hand (:func:`models_record`): 2000 static bytes
    (1000 of parameters, 1000 of gradients) and 100 per sample (90 of activations, 10 of the
    batch), probed at local batches 1 and 2.  ``fields`` replace its fields."""
    from tula.engine.memory import MemoryModel

    base: dict[str, Any] = {
        "param_bytes": 1000,
        "grad_bytes": 1000,
        "optimizer_state_bytes": 0,
        "buffer_bytes": 0,
        "other_static_bytes": 0,
        "activation_bytes_per_sample": 90,
        "batch_bytes_per_sample": 10,
        "probe_local_batches": (1, 2),
        "probe_peak_bytes": (2100, 2200),
        "device": "cpu",
    }
    return MemoryModel(**{**base, **fields})


#: the data set size of :func:`models_record`
MODELS_D = 1000


def models_record(
    perf: Any,
    sizes=(1, 2),
    budget=None,
    oom=None,
    pricing=None,
    epochs=1,
    constraints=None,
    full: bool = True,
    *,
    spec: dict | None = None,
    dataset_size: int = MODELS_D,
    trials=(),
    placement: dict | None = None,
) -> dict:
    """A models record of the performance model ``perf`` (a PerfModel) and :func:`memory_model`:
    D = 1000 samples, B from 10 to 1000, 1 $ per node-second unless ``pricing`` says otherwise.
    ``full``: with the fields a saved record has (version, search, device, memory_probed,
    fit_error) so that it validates.  ``spec``: the job spec (a dict) in place of the one made of
    ``sizes``, ``pricing``, ``epochs`` and ``constraints``; ``dataset_size``, ``trials`` and
    ``placement`` (left out when None): those fields of the record."""
    from tula.core.spec import spec_from_dict

    if spec is None:
        spec = {
            "epochs": epochs,
            "search": {"cluster_sizes": list(sizes), "min_batch": 10, "max_batch": 1000},
            "pricing": pricing or {"kind": "fixed", "price_per_node_hour": 3600.0},
        }
        if constraints is not None:
            spec["constraints"] = constraints
    mem = memory_model()
    rec = {"kind": "tula.models"}
    if full:
        rec.update({"version": 1, "search": "full", "device": "cpu"})
    rec.update(
        {
            "spec": spec_from_dict(spec).to_dict(),
            "dataset_size": dataset_size,
            "memory_budget_bytes": budget,
            "memory": mem.to_dict(),
            "perf": perf.to_dict(),
            "oom_local_batch": oom,
            "trials": list(trials),
        }
    )
    if full:
        rec.update({"memory_probed": mem.to_dict(), "fit_error": {"t_step_median_rel": 0.0}})
    if placement is not None:
        rec["placement"] = placement
    return rec


def epoch(number: int = 1, **fields: Any) -> EpochRecord:
    """Epoch ``number``'s metrics line, whole and checked: 10 steps at B = 64 on 2 workers,
    learning rate 0.1, training and test loss 1.0, 1 s; ``steps_done`` 10 per epoch so far.
    ``fields`` replace or add figures (``epoch_wall_s``, ``b_simple``, ``test_top1``, ...); the
    ones not given stay unset, as in a line that does not carry them."""
    from tula.core.records import EpochRecord

    line: dict[str, Any] = {
        "epoch": number,
        "steps": 10,
        "global_batch": 64,
        "n_workers": 2,
        "lr": 0.1,
        "train_loss": 1.0,
        "epoch_time_s": 1.0,
        "test_loss": 1.0,
        **fields,
    }
    line.setdefault("steps_done", line["steps"] * number)
    return EpochRecord.model_validate(line)


def train_record(history: Sequence[EpochRecord] = (), **fields: Any) -> TrainRecord:
    """A training record of the epochs ``history`` (:func:`epoch`'s), whole and checked: AGS on
    :func:`tiny_spec`, at the last epoch's N, B and steps (2, 64 and 10 without one), as many
    epochs as given (1 without one) and their steps.  ``fields`` replace top-level fields
    (``method``, ``spec``, ``traces``, ``batch_schedule``, ...)."""
    from tula.core.records import TrainRecord

    last = history[-1] if history else None
    record: dict[str, Any] = {
        "kind": "tula.train",
        "version": 1,
        "spec": tiny_spec(),
        "method": "ags",
        "n_workers": last.n_workers if last else 2,
        "global_batch": last.global_batch if last else 64,
        "steps_per_epoch": last.steps if last else 10,
        "epochs": len(history) or 1,
        "steps_done": last.steps_done if last else 0,
        "history": list(history),
        **fields,
    }
    return TrainRecord.model_validate(record)


# --------------------------------------------------------------------------- damaged input (hypothesis)
def json_values():
    """A hypothesis strategy of values JSON and YAML hold: None, booleans, numbers, short
    strings, and lists and mappings of them."""
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )


def other_types(value: Any, *more: Any) -> list:
    """Values of another type than ``value`` (a string of it, a list around it, a number for a
    string, ...), of these and of ``more``."""
    candidates = (
        None,
        True,
        0,
        -1,
        1.5,
        float("nan"),
        float("inf"),
        "",
        "x",
        str(value),
        [],
        [value],
        {},
        {"v": value},
        10**30,
        *more,
    )
    return [v for v in candidates if type(v) is not type(value)]


def mutation_site(data: Any, tree: Any) -> tuple[Any, Any] | None:
    """Where to damage ``tree`` (nested dicts and lists), drawn with hypothesis's ``data``:
    walk down from the top (so top-level fields are hit often), stopping at a random depth.
    Returns the container and its key, or None where the tree is empty."""
    from hypothesis import strategies as st

    node, key = tree, None
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        if isinstance(node[key], (dict, list)) and node[key] and data.draw(st.booleans()):
            node = node[key]
            continue
        break
    return None if key is None else (node, key)


def damaged_bytes(data: Any, raw: bytes) -> bytes:
    """``raw`` cut short or with 1 to 4 bytes flipped, drawn with hypothesis's ``data``."""
    from hypothesis import strategies as st

    out = bytearray(raw)
    if data.draw(st.booleans()):
        out = out[: data.draw(st.integers(0, len(out) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            out[data.draw(st.integers(0, len(out) - 1))] ^= data.draw(st.integers(1, 255))
    return bytes(out)

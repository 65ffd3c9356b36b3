"""``tula.Job``: the pipeline from Python -- profile, fit, plan and train a job, and get the
records the CLI writes.

A job is a spec -- a dict, a YAML path or a :class:`~tula.core.spec.JobSpec` -- and,
optionally, Python objects in place of some of its fields:

* ``model``: a function of no arguments returning a ``torch.nn.Module`` (``model.name``);
* ``data``: a function returning the training and test sets (``data.factory``; its return
  contract is :func:`tula.engine.workloads.load_dataset`'s), called with ``data.kwargs``;
* ``loss``: an ``nn.Module`` class, a function of ``(output, target)`` or a factory of no
  arguments (``train.loss``);
* ``optimizer``: a factory called as ``optimizer(params, lr=LR, **optimizer.kwargs)``
  returning a ``torch.optim.Optimizer`` -- an optimiser class such as ``torch.optim.RMSprop``,
  or ``functools.partial(torch.optim.SGD, momentum=0.5)`` (``optimizer.name``).  Tula sets
  the learning rate: ``optimizer.lr`` with the method's scaling, warm-up and milestones.

Objects travel to the ranks by their import path when importing it finds them again, else as
cloudpickle files in the job's directory (``pickle:PATH`` in the spec), as :mod:`tula.sklearn`
sends its modules: the directory must then be readable by every rank (a shared file system
on a cluster).  Each stage writes its record into ``out`` as the
CLI does -- ``profile.json``, ``models.json``, ``plan.json`` (with ``plan.png``) and
``train/`` -- and returns it as a typed, frozen record (:mod:`tula.core.records`:
``ProfileRecord``, ``ModelsRecord``, ``PlanRecord``, ``TrainRecord``; read its fields as
attributes, ``.to_json_dict()`` gives what its file holds).  ``cluster`` is any value of
``--cluster``, or an open ``distributed.Client`` (its workers run the ranks; the Client stays
yours to close).  Progress goes to ``on_event(stage, event)`` instead of the terminal; the CLI
and the service run the same stage functions (:mod:`tula.pipeline`).

Example::

    job = tula.Job(tula.examples.path("digits"), out="runs/py", on_event=print)
    job.profile()                 # the profile record
    job.fit()                     # the fitted models
    plan = job.plan("time")       # a plan at the fastest configuration
    run = job.train()             # trains at the plan's choice, with AGS
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tula.core.errors import TulaError
from tula.core.events import Event, Note, RecordSaved, StageDone, StageStarted
from tula.core.job_rules import spec_with
from tula.core.records import ModelsRecord, PlanRecord, ProfileRecord, TrainRecord, load_plan, load_profile
from tula.core.spec import JobSpec, load_spec, spec_from_dict
from tula.pipeline import (
    MODELS,
    PLAN,
    PLAN_PNG,
    PROFILE,
    TRAIN_DIR,
    AnyRecord,
    Observer,
    checkpoint_config,
    fit_stage,
    plan_stage,
    profile_stage,
    train_stage,
    training_method,
)

EventCallback = Callable[[str, Event], None]


class _Forward(Observer):
    """The pipeline's events to a callback: ``(stage, event)``; records and notes as events too
    (:mod:`tula.core.events`)."""

    def __init__(self, callback: EventCallback | None) -> None:
        self.callback = callback

    def _send(self, stage: str, ev: Event) -> None:
        if self.callback is not None:
            self.callback(stage, ev)

    def stage(self, name: str, **info: Any) -> None:
        self._send(name, StageStarted(info))

    def done(self, name: str) -> None:
        self._send(name, StageDone())

    def event(self, stage: str, ev: Event) -> None:
        self._send(stage, ev)

    def saved(self, kind: str, record: dict | AnyRecord | None, path: Path) -> None:
        self._send("records", RecordSaved(record_kind=kind, path=str(path)))

    def note(self, message: str) -> None:
        self._send("notes", Note(message))


def _open_client(cluster: Any) -> Any:
    """``cluster`` when it is an open ``distributed.Client``; one sentence otherwise."""
    if isinstance(cluster, (str, bytes)) or not (hasattr(cluster, "scheduler") and hasattr(cluster, "submit")):
        raise TulaError(
            "cluster is a --cluster value (local, dask, tcp://HOST:PORT, a jobqueue YAML file, env) or an open "
            f"distributed.Client, not {type(cluster).__name__}"
        )
    if getattr(cluster, "scheduler", None) is None or getattr(cluster, "status", "") in ("closing", "closed"):
        raise TulaError("cluster is a distributed.Client that is closed; give an open Client or its address")
    return cluster


class Job:
    """One training job driven from Python: profile, fit, plan and train it, and get its records.

    Each stage writes its record into ``out`` as the CLI does (``profile.json``, ``models.json``,
    ``plan.json`` with ``plan.png``, and ``train/``) and returns it as a typed, frozen record
    (:class:`~tula.core.records.ProfileRecord`, :class:`~tula.core.records.ModelsRecord`,
    :class:`~tula.core.records.PlanRecord`, :class:`~tula.core.records.TrainRecord`).  The spec's fields
    are checked when the job is made: a wrong one raises :class:`~tula.core.errors.TulaError`
    with one sentence.

    Parameters
    ----------
    spec : dict or str or pathlib.Path or JobSpec or None
        The job spec: a dict of its fields, the path of a YAML file, or a
        :class:`~tula.core.spec.JobSpec`; ``None`` starts from the defaults (then give
        ``model`` and ``data``).
    model : callable or str or None
        A function of no arguments returning a ``torch.nn.Module``, or an import path
        ``package.module:make``; replaces the spec's ``model.name``.
    data : callable or str or None
        A function returning the training and test sets (``data.factory``), called with the
        spec's ``data.kwargs``; see :func:`tula.engine.workloads.load_dataset` for what it returns.
    loss : object
        An ``nn.Module`` class, a function of ``(output, target)``, or a factory of no arguments
        (``train.loss``); ``None`` keeps the spec's.
    optimizer : callable or str or None
        A factory called as ``optimizer(params, lr=LR, **optimizer.kwargs)`` returning a
        ``torch.optim.Optimizer``, e.g. ``torch.optim.RMSprop``; Tula sets the learning rate.
    out : str or pathlib.Path or None
        The directory the records go to; default ``runs/NAME`` (the spec's name).
    cluster : str or distributed.Client or None
        Where the ranks run: any value of ``--cluster`` (``local``, ``dask``,
        ``tcp://HOST:PORT``, a jobqueue YAML file, ``env``), or an open ``distributed.Client``
        (it stays yours to close); ``None`` keeps the spec's.
    on_event : callable or None
        Called as ``on_event(stage, event)`` with each progress event (a typed, frozen
        :class:`~tula.core.events.Event`: match on its class; ``event.to_json_dict()`` is the
        dict these events were before) instead of printing to the terminal.

    Attributes
    ----------
    spec : JobSpec
        The checked spec, with the Python objects given in place of their fields.
    out : pathlib.Path
        The directory the records are written to.
    profile_record, models, plan_record : ProfileRecord, ModelsRecord, PlanRecord or None
        The records made so far by :meth:`profile`, :meth:`fit` and :meth:`plan`.

    Raises
    ------
    TulaError
        If the spec or an argument is invalid (one sentence).

    Examples
    --------
    >>> import tula
    >>> job = tula.Job("digits.yaml", out="runs/py", on_event=print)
    >>> profile = job.profile()  # the profile record
    >>> models = job.fit()  # the fitted models
    >>> plan = job.plan("time")  # the fastest configuration
    >>> run = job.train()  # trains at the plan's choice, with AGS

    ``tula examples copy digits`` writes ``digits.yaml`` to start from; :meth:`run` does the
    four stages in one call.
    """

    def __init__(
        self,
        spec: dict | str | Path | JobSpec | None = None,
        *,
        model: Callable[[], Any] | None = None,
        data: Callable[..., Any] | None = None,
        loss: Any = None,
        optimizer: Callable[..., Any] | None = None,
        out: str | Path | None = None,
        cluster: Any = None,
        on_event: EventCallback | None = None,
    ) -> None:
        if spec is None:
            d: dict = {}
        elif isinstance(spec, JobSpec):
            d = spec.to_dict()
        elif isinstance(spec, dict):
            d = dict(spec)
        elif isinstance(spec, (str, Path)):
            d = load_spec(spec).to_dict()
        else:
            raise TulaError(f"a job's spec is a dict, a YAML path or a JobSpec, not {type(spec).__name__}")
        self.out = Path(out) if out is not None else Path("runs") / str(d.get("name", "job"))
        self.out.mkdir(parents=True, exist_ok=True)
        d = self._with_objects(d, model=model, data=data, loss=loss, optimizer=optimizer)
        self.client = None  # a distributed.Client the ranks run on (the caller's)
        if cluster is not None and not isinstance(cluster, str):
            self.client = _open_client(cluster)
        self.spec = spec_from_dict(d)  # every field checked here: one sentence for the first wrong one
        if isinstance(cluster, str):  # checked again with it: a cluster the spec refuses is its sentence
            self.spec = spec_with(self.spec, cluster=self.spec.cluster.model_copy(update={"where": cluster}))
        self.observer = _Forward(on_event)
        self.profile_record: ProfileRecord | None = None
        self.models: ModelsRecord | None = None
        self.plan_record: PlanRecord | None = None

    def _with_objects(self, d: dict, **objects: Any) -> dict:
        """The spec with each Python object given in place of its field: its import path, or a
        cloudpickle file in ``out`` (:func:`tula.engine.workloads.send_to_ranks`)."""
        from tula.engine.workloads import send_to_ranks

        d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
        for what, obj in objects.items():
            if obj is None:
                continue
            if isinstance(obj, str):  # a name or an import path, as in a spec
                ref = obj
            elif callable(obj):
                ref = send_to_ranks(obj, (self.out / f"{what}.pkl").resolve())
            else:
                raise TulaError(f"{what} must be a function or a class (or an import path), not {type(obj).__name__}")
            if what == "model":
                d["model"] = {"name": ref, "kwargs": dict((d.get("model") or {}).get("kwargs") or {})}
            elif what == "data":
                kept = {k: v for k, v in (d.get("data") or {}).items() if k in ("kwargs", "loader_workers")}
                d["data"] = {**kept, "name": "factory", "factory": ref}
            elif what == "optimizer":
                d["optimizer"] = {**(d.get("optimizer") or {}), "name": ref}
            else:
                d["train"] = {**(d.get("train") or {}), "loss": ref}
        return d

    # ------------------------------------------------------------------ the stages
    def profile(self, search: str = "partial", resume: bool = False) -> ProfileRecord:
        """Profile the job: run real trials of batch sizes and worker counts.

        Parameters
        ----------
        search : str
            ``partial`` (a few batch sizes per worker count, the default) or ``full``.
        resume : bool
            Go on from the trials an interrupted profile in ``out`` finished.

        Returns
        -------
        ProfileRecord
            The profile record (also written to ``out/profile.json``).
        """
        if search not in ("partial", "full"):
            raise TulaError(f"search is 'partial' or 'full', not {search!r}")
        previous = load_profile(self.out / PROFILE) if resume else None
        self.profile_record = profile_stage(
            self.spec, search, self.out / PROFILE, previous=previous, launcher=self._launcher(), observer=self.observer
        )
        return self.profile_record

    def fit(self) -> ModelsRecord:
        """Fit the memory and performance models to the profile.

        Returns
        -------
        ModelsRecord
            The models record (also written to ``out/models.json``).

        Raises
        ------
        TulaError
            If :meth:`profile` has not run.
        """

        if self.profile_record is None:
            raise TulaError("fit needs a profile: call profile() first")
        self.models = fit_stage(self.profile_record, self.out / MODELS, self.observer)
        return self.models

    def plan(self, objective: str | None = None, **options: Any) -> PlanRecord:
        """Choose a configuration (worker count and batch size) from the fitted models.

        Parameters
        ----------
        objective : str or None
            What to optimise: ``time``, ``cost``, ``knee`` or another of the planner's
            objectives; ``None`` takes the spec's.
        **options : Any
            Passed to :func:`tula.core.plan.make_plan` (``constraints``, ``pricing``,
            ``compare_spot``).

        Returns
        -------
        PlanRecord
            The plan record (also written to ``out/plan.json``, with ``out/plan.png``).
        """

        if self.models is None:
            self.fit()
        assert self.models is not None
        self.plan_record = plan_stage(
            self.models, objective, self.out / PLAN, self.out / PLAN_PNG, self.observer, **options
        )
        return self.plan_record

    def train(
        self,
        method: str | None = None,
        n_workers: int | None = None,
        global_batch: int | None = None,
        resume: bool = False,
        accumulation_steps: int | None = None,
        plan: PlanRecord | dict | str | Path | None = None,
    ) -> TrainRecord:
        """Train the model, by default at the plan's choice.

        The configuration follows the rule of every front
        (:func:`tula.core.job_rules.train_config`): each argument given here, else the plan's
        choice, else the spec's ``train`` fields; the data is built at the plan's sequence
        length, else the spec's (:func:`tula.core.job_rules.training_spec`).

        Parameters
        ----------
        method : str or None
            The training method (``ags``, ``lbt``, ``lars``, ...); ``None`` takes the spec's
            (``lbt`` where AGS has nothing to scale).
        n_workers : int or None
            The number of workers; ``None`` takes the plan's (or the spec's ``train.n_workers``).
        global_batch : int or None
            The global batch size; ``None`` takes the plan's (or the spec's ``train.global_batch``).
        resume : bool
            Continue from the checkpoint an interrupted run left in ``out/train`` (at its
            configuration, where nothing else gives one).
        accumulation_steps : int or None
            Micro-batches per step; ``None`` takes the plan's when it gives the worker count and
            the batch, else the spec's ``train.accumulation_steps``.
        plan : PlanRecord, dict, str, pathlib.Path or None
            The plan to train at: a plan record (typed, or as read from JSON), or the path of a
            ``plan.json``; ``None`` takes the one :meth:`plan` made, if any.

        Returns
        -------
        TrainRecord
            The training run record (also written to ``out/train/train.json``).

        Raises
        ------
        TulaError
            If there is no configuration: neither a plan nor ``n_workers`` and ``global_batch``.
        """
        from tula.core.job_rules import NoConfigError, train_config, training_spec

        if isinstance(plan, (str, Path)):
            plan = load_plan(Path(plan))
        spec = self.spec
        if accumulation_steps is not None:  # checked as a spec field: one sentence for a bad one
            spec = spec_with(spec, train=spec.train.model_copy(update={"accumulation_steps": accumulation_steps}))
        train_dir = self.out / TRAIN_DIR
        planned = plan if plan is not None else self.plan_record
        try:
            config = train_config(
                spec,
                planned,
                n_workers=n_workers,
                global_batch=global_batch,
                accumulation_steps=accumulation_steps,
                checkpoint=(lambda: checkpoint_config(train_dir)) if resume else None,
            )
        except NoConfigError:
            raise TulaError(
                "train needs a configuration: call plan() first, or give n_workers and global_batch"
            ) from None
        spec = training_spec(spec, config, planned)  # its k and the plan's sequence length
        method = training_method(spec, config.global_batch, self.observer, method)
        return train_stage(
            spec,
            method,
            config.n_workers,
            config.global_batch,
            train_dir,
            resume=resume,
            launcher=self._launcher(),
            observer=self.observer,
            models=self.models,
        )

    def _launcher(self) -> Any:
        """The launcher on the caller's Client, or None: the stages open the spec's ``cluster``
        (local ranks: their fork server starts now, importing torch beside this process, as the CLI's)."""
        if self.client is None:
            if self.spec.cluster.where == "local":
                from tula.engine.forkserver import start_fork_server

                start_fork_server()
            return None
        from tula.engine.launch.clusters import launcher_for_client

        _open_client(self.client)  # still open
        return launcher_for_client(self.client, self.spec)

    def run(self, search: str = "partial", objective: str | None = None) -> dict[str, AnyRecord]:
        """Profile, fit, plan and train, as ``tula run`` does.

        Parameters
        ----------
        search : str
            The profile's search, ``partial`` or ``full``.
        objective : str or None
            The plan's objective; ``None`` takes the spec's.

        Returns
        -------
        dict of str to record
            The records by kind: ``profile``, ``models``, ``plan`` and ``train``.
        """
        profile, models, plan = self.profile(search), self.fit(), self.plan(objective)
        return {"profile": profile, "models": models, "plan": plan, "train": self.train()}

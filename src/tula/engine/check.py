"""``tula check``: what a job spec's workload is, found without profiling.

The model, data sets and loss are built by the same rules the ranks use
(:func:`tula.engine.workloads.check_workload`: the factories imported and called, a forward pass
and the loss on two training samples; the blocks ``train.checkpointing`` wraps found), in this
process: no DDP world, no fork server.  Then the checks a run makes before any worker, each the
one function the run calls: ``train.parallelism`` fsdp with what it cannot train
(:func:`tula.core.job_rules.check_parallelism`) and ``search.sequence_lengths`` against the model
and the data (:func:`tula.engine.sequence_lengths.check_sequence_lengths`).  A failure is the
same one sentence a run would give (:class:`~tula.core.errors.WorkloadError`,
:class:`~tula.core.errors.SpecError`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tula.core.job_rules import check_parallelism, fsdp_obstacle
from tula.core.sinks import check_sinks
from tula.core.spec import JobSpec, reference_sequence_length
from tula.engine.checkpointing import auto_block_classes, checkpoint_blocks
from tula.engine.sequence_lengths import check_sequence_lengths, positional_limit
from tula.engine.workloads import check_workload


@dataclass(frozen=True)
class CheckResult:
    """What ``tula check`` found: the workload a spec builds.

    Attributes
    ----------
    model : the spec's model name and the module's class, e.g. ``small_cnn (SmallCNN)``
    parameters : its trainable parameters
    data : the data set's name
    train_size : training samples
    test_size : test samples
    sample_shape : one input's shape
    classes : the classes (0 when the set does not say, e.g. a regression)
    loss : the spec's train.loss
    sequence_lengths : the sequence lengths checked against the model (``search.sequence_lengths``,
        else the data's own length); empty for data without one
    positional_limit : the longest sequence the model says it takes (``None``: it says nothing)
    checkpointing : the spec's train.checkpointing (off, on or auto)
    checkpoint_blocks : the blocks ``train.checkpointing`` on or auto wraps (0 when off)
    block_classes : those blocks' class names, sorted
    parallelism : the spec's train.parallelism (ddp, fsdp or auto)
    fsdp_obstacle : with auto, why the plan may not weigh fsdp (``None``: it may, or not auto)
    """

    model: str
    parameters: int
    data: str
    train_size: int
    test_size: int
    sample_shape: tuple[int, ...]
    classes: int
    loss: str
    sequence_lengths: tuple[int, ...] = ()
    positional_limit: int | None = None
    checkpointing: str = "off"
    checkpoint_blocks: int = 0
    block_classes: tuple[str, ...] = ()
    parallelism: str = "ddp"
    fsdp_obstacle: str | None = None


def check_job(spec: JobSpec) -> CheckResult:
    """Build ``spec``'s model, data sets and loss and run two training samples through them.

    Parameters
    ----------
    spec : JobSpec
        A validated job spec (:func:`tula.core.spec.load_spec`).

    Returns
    -------
    CheckResult
        What was found: the model, its trainable parameters, the data set, its sizes, a
        sample's shape, the classes, the loss, the sequence lengths checked, the blocks
        checkpointing wraps and the parallelism.
    """
    check_sinks(spec.train.loggers)  # a metrics sink whose package is missing: refused as training would
    check_parallelism(spec)  # fsdp with a method that needs the whole gradient, fp16, the noise scale: as a run
    torch.manual_seed(spec.seed)
    model, data = check_workload(spec)  # checkpointing that matches nothing, a dict batch the model cannot take
    try:
        check_sequence_lengths(spec, model)  # a length above the model's limit, or for a factory without lengths
        ref = reference_sequence_length(spec.data)
        lengths = spec.search.sequence_lengths or ([] if ref is None else [ref])
        t = spec.train
        blocks = 0 if t.checkpointing == "off" else checkpoint_blocks(model, t.checkpoint_modules, wrap=False)
        classes = (t.checkpoint_modules or sorted(c.__name__ for c in auto_block_classes(model))) if blocks else []
        return CheckResult(
            model=f"{spec.model.name} ({type(model).__name__})",
            parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
            data=data.name,
            train_size=data.train_size,
            test_size=data.test_size,
            sample_shape=tuple(data.sample_shape),
            classes=data.num_classes,
            loss=spec.train.loss,
            sequence_lengths=tuple(sorted(lengths)),
            positional_limit=positional_limit(model),
            checkpointing=t.checkpointing,
            checkpoint_blocks=blocks,
            block_classes=tuple(sorted(classes)),
            parallelism=t.parallelism,
            fsdp_obstacle=fsdp_obstacle(spec) if t.parallelism == "auto" else None,
        )
    finally:
        data.close()

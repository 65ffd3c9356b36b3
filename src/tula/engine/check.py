"""``tula check``: what a job spec's workload is, found without profiling.

The model, data sets and loss are built by the same rules the ranks use
(:func:`tula.engine.workloads.check_workload`: the factories imported and called, a forward pass
and the loss on two training samples), in this process: no DDP world, no fork server.  A
failure is the same one sentence a profile would give (:class:`~tula.core.errors.WorkloadError`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tula.core.sinks import check_sinks
from tula.core.spec import JobSpec
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
    """

    model: str
    parameters: int
    data: str
    train_size: int
    test_size: int
    sample_shape: tuple[int, ...]
    classes: int
    loss: str


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
        sample's shape, the classes and the loss.
    """
    check_sinks(spec.train.loggers)  # a metrics sink whose package is missing: refused as training would
    torch.manual_seed(spec.seed)
    model, data = check_workload(spec)
    try:
        return CheckResult(
            model=f"{spec.model.name} ({type(model).__name__})",
            parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
            data=data.name,
            train_size=data.train_size,
            test_size=data.test_size,
            sample_shape=tuple(data.sample_shape),
            classes=data.num_classes,
            loss=spec.train.loss,
        )
    finally:
        data.close()

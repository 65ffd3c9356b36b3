"""The knobs GPU users set, in one place: ``train.tf32``, ``train.cudnn_benchmark`` and
``train.channels_last`` (:class:`tula.core.spec.TrainSpec`).

A rank applies them before it builds its model, for profiling and training alike
(:class:`tula.engine.profile._Worker`, :class:`tula.engine.rank_loop._RankTrainer`), so the steps a
profile times are those training runs:

* :func:`set_backend_knobs` sets torch's process-wide switches: TF32 matrix products and
  convolutions (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``)
  and cuDNN's autotuner (``torch.backends.cudnn.benchmark``), and flushes subnormal floats to zero
  (:func:`flush_denormals`: on a CPU their arithmetic slowed a step as its model trained).  ``train.tf32`` true turns both
  TF32 switches on, false both off, and left out (``None``) gives torch's defaults -- off for
  matrix products but ON for convolutions, so a job that does not ask keeps what torch does
  (a strict-float32 default would make every fp32 convolution several times slower on an
  Ampere or newer GPU).  Every switch is set each time, so a rank never inherits what an
  earlier job in the same process left.  The TF32 and cuDNN switches change CUDA kernels only:
  on a CPU they have no effect.
* :func:`to_memory_format` puts the model's parameters and buffers in
  ``torch.channels_last`` and registers a forward pre-hook that converts every 4-D input
  tensor the model is called with to it -- where the model consumes its input, so DDP's
  forward, evaluation, AGS's small batch and the profile's noise-scale passes all see the
  same layout, and no data path needs to know.  The converted copy of the batch is made
  inside the forward, so the profile's memory probes count it.  It works on a CPU too.

:func:`channels_last_problem` is the rule of which inputs ``channels_last`` applies to (4-D
batches: samples, channels, height, width); :func:`tula.engine.workloads.check_workload`
refuses a job whose samples are not 3-D with its sentence before any rank starts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tula.core.spec import TrainSpec

#: torch's own TF32 switches, what ``train.tf32`` left out means: off for float32 matrix
#: products, on for cuDNN convolutions (torch's documented defaults since 1.12)
TORCH_TF32_DEFAULTS = {"matmul": False, "cudnn": True}


def tf32_switches(tf32: bool | None) -> dict[str, bool]:
    """The TF32 switches ``train.tf32`` asks for: both on, both off, or torch's defaults (``None``)."""
    return dict(TORCH_TF32_DEFAULTS) if tf32 is None else {"matmul": tf32, "cudnn": tf32}


def set_backend_knobs(train: TrainSpec) -> None:
    """Set torch's TF32 and cuDNN-autotuner switches as ``train.tf32`` and
    ``train.cudnn_benchmark`` ask (no effect on CPU kernels)."""
    tf32 = tf32_switches(train.tf32)
    torch.backends.cuda.matmul.allow_tf32 = tf32["matmul"]
    torch.backends.cudnn.allow_tf32 = tf32["cudnn"]
    torch.backends.cudnn.benchmark = bool(train.cudnn_benchmark)
    flush_denormals()


def flush_denormals() -> bool:
    """Treat subnormal floats as zero on this CPU (x86 SSE3's FTZ and DAZ, ARM's FZ; True when set):
    in the calling thread and the intra-op threads started after it (they inherit the setting, threads
    started before do not), so a fresh rank process calls it first and :func:`set_backend_knobs` again.

    An arithmetic instruction that meets a subnormal operand or result takes a microcode assist on x86,
    many times the cycles of a normal one, so a step's time depended on how far the model had trained:
    a trained language model's attention backward outputs subnormal gradients (measured 2026-11-29,
    tiny_gpt 2 x 64 on ``text``, b = 64, L = 32, AdamW, one thread: about 9,700 subnormal values a
    step from ``_scaled_dot_product_flash_attention_for_cpu_backward`` after 155 steps), and the
    matrix products that take them slowed the step from 28 to 37-44 ms within 3-6 s of training --
    a plain PyTorch loop on the same data alike; flushed, 27-32 ms throughout.  A profile's later
    trials then ran slower than its first and than a fresh world (B = 64 after a B = 8 trial: 36-44
    ms, 26-28 ms flushed): it measured how far it had trained, not the step.  A value below 1.2e-38
    (float32) changes no update that matters; GPUs handle subnormals at full speed."""
    return bool(torch.set_flush_denormal(True))


def _to_channels_last(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    # a forward pre-hook: the 4-D tensors among the positional inputs, in channels_last
    return tuple(
        a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.ndim == 4 else a
        for a in args
    )


def to_memory_format(model: nn.Module, train: TrainSpec) -> nn.Module:
    """``model`` in the memory format of ``train.channels_last`` (the same module, converted in
    place; unchanged when it is false)."""
    if train.channels_last:
        model.to(memory_format=torch.channels_last)
        model.register_forward_pre_hook(_to_channels_last)
    return model


def channels_last_problem(sample_shape: tuple[int, ...]) -> str | None:
    """One sentence when ``train.channels_last`` cannot apply to samples of ``sample_shape``
    (it needs image samples: channels, height, width), else ``None``."""
    if len(sample_shape) == 3:
        return None
    return (
        f"train.channels_last lays out 4-D input batches (samples, channels, height, width), but the "
        f"samples here have shape {tuple(sample_shape)}; leave train.channels_last false for this data set"
    )

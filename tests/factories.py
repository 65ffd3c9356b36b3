"""A user's own code for tests/test_user_factories.py: a segmentation-like data factory, a
per-pixel loss and a tiny fully-convolutional model, each referred to by an import path
(``factories:make_segmentation``) as a user's spec would; and factories that go wrong in
each way Tula must say in one sentence."""

from __future__ import annotations

import torch
from torch import nn


class Segmentation(torch.utils.data.Dataset):
    """Samples ``(1 x S x S image, S x S mask)``: the mask marks where a smooth blob is
    positive, the image is the blob plus noise."""

    def __init__(self, images: torch.Tensor, masks: torch.Tensor):
        self.images, self.masks = images, masks

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.masks[i]


def _blobs(n: int, size: int, seed: int, labels: bool) -> Segmentation:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(n, 1, size // 4, size // 4, generator=g)
    signal = nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    images = signal + 0.3 * torch.randn(n, 1, size, size, generator=g)
    masks = (signal[:, 0] > 0).long() if labels else (signal[:, 0] > 0).float()
    return Segmentation(images, masks)


def make_segmentation(n: int = 200, size: int = 8, seed: int = 0, labels: bool = False, as_mapping: bool = False):
    """``n`` training and ``n // 4`` test samples from a seeded generator (the same sets on every
    call); ``labels``: integer masks (for a per-pixel cross-entropy), else float masks (BCE)."""
    train = _blobs(n, size, seed, labels)
    test = _blobs(n // 4, size, seed + 1, labels)
    if as_mapping:
        return {"train": train, "test": test, "num_classes": 2, "collate_fn": stack_pairs}
    return train, test


def stack_pairs(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    """A collate function of the user's own: stacks (image, mask) pairs."""
    return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])


class PixelBCE(nn.Module):
    """Per-pixel binary cross-entropy of (n x 1 x H x W) logits against (n x H x W) float masks."""

    def forward(self, out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), mask)


def tiny_fcn(in_channels: int = 1, out_channels: int = 1, width: int = 8) -> nn.Module:
    """A fully-convolutional net: one score map per output channel, the input's size."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, out_channels, 3, padding=1),
    )


# --------------------------------------------------------------------------- what goes wrong
def one_set(**kwargs):
    return _blobs(20, 8, 0, False)


def not_datasets(**kwargs):
    return [1, 2, 3], [4]


def raises(**kwargs):
    raise ValueError("the bucket s3://[bold]seg[/bold] is not reachable")


def three_channel(**kwargs):
    """Samples of 3 x 8 x 8 images: a 1-channel model cannot take them."""
    train, test = make_segmentation(20)
    return Segmentation(train.images.repeat(1, 3, 1, 1), train.masks), test


NOT_A_LOSS = 42


def not_an_optimizer(params, lr):
    return [p for p in params]


def own_parameters(params, lr):
    """An optimiser over parameters of its own, not the ones it was given."""
    return torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=lr)


# --------------------------------------------------------------------------- a known noise scale
def linear_regression(n: int = 4000, d: int = 16, sigma: float = 1.0, seed: int = 0):
    """y = w* . x + e with x ~ N(0, I_d), |w*| = 1, e ~ N(0, sigma^2): at w = 0 the MSE's
    per-sample gradient -2 (w* . x + e) x has mean G = -2 w* and tr(Sigma) = 4 ((1 + sigma^2) d
    + 1), so the noise scale is B_simple = d (1 + sigma^2) + 1 (Gaussian fourth moments)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d, generator=g)
    w /= w.norm()
    x = torch.randn(n, d, generator=g)
    y = (x @ w + sigma * torch.randn(n, generator=g)).unsqueeze(1)
    full = torch.utils.data.TensorDataset(x, y)
    cut = n * 9 // 10
    return torch.utils.data.Subset(full, range(cut)), torch.utils.data.Subset(full, range(cut, n))


def linear_at_zero(d: int = 16) -> nn.Module:
    """w = 0, no bias: where linear_regression's noise scale is known."""
    m = nn.Linear(d, 1, bias=False)
    nn.init.zeros_(m.weight)
    return m


# --------------------------------------------------------------------------- failing and slow samples
class BreaksAfter(torch.utils.data.Dataset):
    """``base``'s samples, but reading sample ``bad`` raises, as a corrupt file would; every
    read first sleeps ``delay_s`` (a slow disk)."""

    def __init__(self, base: torch.utils.data.Dataset, bad: int | None, delay_s: float = 0.0):
        self.base, self.bad, self.delay_s = base, bad, delay_s

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        if self.delay_s:
            import time

            time.sleep(self.delay_s)
        if i == self.bad:
            raise OSError(f"sample {i} is corrupt: [bold]bad[/bold] header")
        return self.base[i]


def corrupt_sample(n: int = 200, bad: int | None = 37, delay_s: float = 0.0, **kwargs):
    """make_segmentation's sets, whose training sample ``bad`` cannot be read."""
    train, test = make_segmentation(n)
    return BreaksAfter(train, bad, delay_s), test


class ChannelsLastOnly(nn.Module):
    """A tiny CNN that refuses, in its forward, weights or an input batch not laid out in
    ``torch.channels_last``: a rank that profiles or trains it without ``train.channels_last``
    applied (to the model and to every batch it consumes) fails (tests/test_gpu_knobs.py)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous(memory_format=torch.channels_last):
            raise RuntimeError(f"an input batch of strides {x.stride()} is not channels_last")
        if not self.conv.weight.is_contiguous(memory_format=torch.channels_last):
            raise RuntimeError("the convolution's weight is not channels_last")
        h = torch.relu(self.bn(self.conv(x)))
        return self.head(h.mean(dim=(2, 3)))


def swallows_ctrl_c(**kwargs):
    """A model factory that catches the KeyboardInterrupt a Ctrl-C raises in it and goes on, as
    some libraries' callbacks do ("Exception ignored in ..."): the command must not then succeed."""
    import os
    import signal
    import time

    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)  # the handler runs at the next bytecode boundary: the KeyboardInterrupt comes here
    except KeyboardInterrupt:
        pass
    return tiny_fcn(**kwargs)

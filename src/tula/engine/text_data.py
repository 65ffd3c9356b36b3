"""``text``: sequences of characters of text this machine already has, for next-character
prediction -- the data set of the built-in transformer workload (:mod:`tula.engine.tiny_gpt`).

Nothing is downloaded.  The corpus is the bytes of Python's own standard library sources
(the ``*.py`` files directly in ``sysconfig.get_paths()["stdlib"]``, in sorted name order,
the first :data:`CORPUS_CAP_BYTES` of them); the vocabulary is the 256 byte values.  It is
read once and kept as a ``.npy`` file in :func:`tula.engine.data_cache.data_cache_dir`
(beside MNIST-1D's cache), written whole or not at all, under a name that holds the Python
version and a digest of the files read -- so every rank of every world reads the same ids in
milliseconds, and ranks on hosts with the same Python get the same corpus.

A job names it as a built-in set (``data.sequence_length``, ``data.num_samples`` sequences,
``data.test_fraction``; :func:`tula.engine.workloads.load_dataset` calls :func:`text_datasets`)::

    data:
      name: text
      sequence_length: 64
      num_samples: 4096
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tula.engine.data_cache import data_cache_dir, write_cache_file

#: the most bytes of standard-library source the corpus holds
CORPUS_CAP_BYTES = 2 * 1024 * 1024
#: token ids are bytes
VOCAB_SIZE = 256


def _source_files() -> list[Path]:
    """The standard library's top-level ``*.py`` files, sorted by name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted((p for p in stdlib.glob("*.py") if p.is_file()), key=lambda p: p.name)


def corpus_cache_path() -> Path:
    """Where the encoded corpus is cached: its name holds the Python version and a digest of
    the source files' names and sizes (another Python, or changed sources, is another file)."""
    digest = hashlib.sha256()
    for p in _source_files():
        digest.update(f"{p.name}\0{p.stat().st_size}\n".encode())
    name = f"text-stdlib-py{platform.python_version()}-{digest.hexdigest()[:12]}-cap{CORPUS_CAP_BYTES}.npy"
    return data_cache_dir() / name


def _read_corpus() -> np.ndarray:
    parts, size = [], 0
    for p in _source_files():
        data = p.read_bytes() + b"\n"
        parts.append(data[: CORPUS_CAP_BYTES - size])
        size += len(parts[-1])
        if size >= CORPUS_CAP_BYTES:
            break
    return np.frombuffer(b"".join(parts), dtype=np.uint8).copy()


def text_corpus() -> np.ndarray:
    """The corpus as ``uint8`` token ids (bytes), from the cache when it is there and whole,
    else read from the sources and cached (a temporary file renamed: ranks of one world may
    write it at once; a cache that cannot be written is skipped)."""
    path = corpus_cache_path()
    with contextlib.suppress(OSError, ValueError, EOFError):
        cached = np.load(path, allow_pickle=False)
        if cached.dtype == np.uint8 and cached.ndim == 1 and cached.size > 0:
            return cached
    corpus = _read_corpus()
    write_cache_file(path, lambda f: np.save(f, corpus, allow_pickle=False))
    return corpus


def text_datasets(
    sequence_length: int = 64, num_sequences: int = 4096, test_fraction: float = 0.2, seed: int = 0
) -> dict[str, Any]:
    """Training and test sets of ``num_sequences`` sequences of text, for next-character prediction.

    Sequence ``i`` is ``sequence_length + 1`` bytes of the corpus (:func:`text_corpus`) from
    offset ``i * stride`` (``stride``: the corpus's length over ``num_sequences``, so the
    sequences do not overlap and span the corpus); a sample is ``(inputs, targets)``, both
    ``LongTensor`` of ``sequence_length`` ids, ``targets`` the inputs shifted by one.  A
    fixed permutation drawn from ``seed`` holds out ``test_fraction`` of the sequences.

    Returns
    -------
    dict
        ``train`` and ``test`` (``TensorDataset`` of inputs and targets) and ``num_classes``
        (256, the byte values: the model's ``vocab_size``).

    Raises
    ------
    ValueError
        If the lengths are not positive, ``test_fraction`` is outside (0, 1), or the corpus
        holds fewer than ``num_sequences`` sequences of that length.
    """
    if sequence_length < 1 or num_sequences < 2:
        raise ValueError(
            f"sequence_length must be at least 1 and num_sequences at least 2 (got {sequence_length}, {num_sequences})"
        )
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1 (got {test_fraction})")
    corpus = text_corpus()
    stride = len(corpus) // num_sequences
    if stride < sequence_length + 1:
        raise ValueError(
            f"the text corpus ({len(corpus)} bytes) holds at most {len(corpus) // (sequence_length + 1)} sequences "
            f"of {sequence_length} characters, not {num_sequences}; lower num_sequences or sequence_length"
        )
    starts = np.arange(num_sequences, dtype=np.int64)[:, None] * stride
    windows = torch.from_numpy(corpus[starts + np.arange(sequence_length + 1)].astype(np.int64))
    inputs, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    perm = torch.randperm(num_sequences, generator=torch.Generator().manual_seed(seed))
    n_test = max(1, int(round(num_sequences * test_fraction)))
    te, tr = perm[:n_test], perm[n_test:]
    return {
        "train": torch.utils.data.TensorDataset(inputs[tr], targets[tr]),
        "test": torch.utils.data.TensorDataset(inputs[te], targets[te]),
        "num_classes": VOCAB_SIZE,
    }

"""Training checkpoints: written atomically with a checksum, the last two kept.

A checkpoint file is one header line and a ``torch.save`` payload::

    TULA-CKPT <format version> <sha256 of the payload> <payload bytes>\\n<payload>

so a file cut short or changed is recognised before torch unpickles a byte of it.
Writing goes through a temporary file that is flushed, then the current checkpoint
becomes ``checkpoint.prev.pt`` and the new one ``checkpoint.pt``; a damaged checkpoint
points at the previous good one.  The payload's header fields are checked against
:class:`tula.core.records.CheckpointMeta`.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from tula.core.errors import RecordError
from tula.core.records import CHECKPOINT_KIND, VERSIONS, CheckpointMeta, validate_record

CHECKPOINT = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"
MAGIC = b"TULA-CKPT"
FORMAT = 1

#: checkpoint fields that are not part of its checked header
PAYLOAD_KEYS = ("model", "method_state", "torch_rng")


def save_checkpoint(state: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``state`` as ``out_dir/checkpoint.pt``, keeping the one before as ``checkpoint.prev.pt``."""
    out = Path(out_dir)
    state = {"kind": CHECKPOINT_KIND, "version": VERSIONS[CHECKPOINT_KIND], **state}
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = b"%s %d %s %d\n" % (MAGIC, FORMAT, hashlib.sha256(payload).hexdigest().encode(), len(payload))
    tmp = out / f".{CHECKPOINT}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(header)
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    current = out / CHECKPOINT
    if current.exists():
        os.replace(current, out / PREVIOUS)
    os.replace(tmp, current)
    return current


def _read(path: Path, map_location: Any) -> dict:
    """Check and load one checkpoint file; RecordError with the reason when it is damaged."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise RecordError(f"{path} cannot be read ({err.strerror})") from None
    head, sep, payload = raw.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 4 or parts[0] != MAGIC:
        raise RecordError(f"{path} is not a Tula checkpoint (no checkpoint header)")
    try:
        fmt, digest, size = int(parts[1]), parts[2].decode(), int(parts[3])
    except (ValueError, UnicodeDecodeError):
        raise RecordError(f"{path} is a damaged checkpoint (its header is unreadable)") from None
    if fmt > FORMAT:
        raise RecordError(f"{path} was written by a newer Tula (checkpoint format {fmt}); upgrade Tula")
    if len(payload) != size:
        raise RecordError(f"{path} is a damaged checkpoint: it is cut short ({len(payload)} of {size} bytes)")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise RecordError(f"{path} is a damaged checkpoint: its checksum does not match its contents")
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)
    except Exception as err:  # noqa: BLE001 - the checksum matched, so the writer was not this Tula
        raise RecordError(f"{path} cannot be loaded as a checkpoint ({type(err).__name__})") from None
    if not isinstance(state, dict):
        raise RecordError(f"{path} is not a Tula checkpoint")
    validate_record({k: v for k, v in state.items() if k not in PAYLOAD_KEYS}, str(path))
    missing = [k for k in PAYLOAD_KEYS if k not in state]
    if missing:
        raise RecordError(f"{path} is a damaged checkpoint: it has no {missing[0]!r}")
    return state


def has_checkpoint(out_dir: str | Path) -> bool:
    out = Path(out_dir)
    return (out / CHECKPOINT).exists() or (out / PREVIOUS).exists()


def load_checkpoint(out_dir: str | Path, map_location: Any = "cpu") -> dict:
    """The latest good checkpoint in ``out_dir``.

    If ``checkpoint.pt`` is damaged the error names the previous one when it is intact
    (nothing is deleted or replaced here: the user decides).  If only the previous one
    exists (the writer was killed between its two renames), it is the latest."""
    out = Path(out_dir)
    current, previous = out / CHECKPOINT, out / PREVIOUS
    if not current.exists():
        if previous.exists():
            return _read(previous, map_location)
        raise RecordError(f"there is no checkpoint in {out} to resume from")
    try:
        return _read(current, map_location)
    except RecordError as err:
        if previous.exists():
            try:
                prev_epoch = _header(_read(previous, "cpu")).epoch
            except RecordError:
                raise RecordError(
                    f"{err}; the previous checkpoint {previous} is damaged too, so this run cannot be resumed"
                ) from None
            raise RecordError(
                f"{err}; the previous checkpoint {previous} (epoch {prev_epoch}) is intact: move it "
                f"to {current} and resume again to continue from there"
            ) from None
        raise RecordError(f"{err}; no earlier checkpoint is kept, so this run cannot be resumed") from None


def checkpoint_meta(out_dir: str | Path) -> dict:
    """The checked header of the latest good checkpoint (no model tensors kept)."""
    state = load_checkpoint(out_dir, "cpu")
    return {k: v for k, v in state.items() if k not in PAYLOAD_KEYS}


def checkpoint_header(out_dir: str | Path) -> CheckpointMeta:
    """:func:`checkpoint_meta` as the typed, frozen header
    (:class:`~tula.core.records.CheckpointMeta`; the fields it does not name -- the schedule's
    state, the next configuration, the precision's state -- kept as the checkpoint has them)."""
    return _header(load_checkpoint(out_dir, "cpu"))


def _header(state: dict[str, Any]) -> CheckpointMeta:
    """The header of a checkpoint ``state`` (:func:`_read` checked it), typed."""
    return CheckpointMeta.model_validate({k: v for k, v in state.items() if k not in PAYLOAD_KEYS})

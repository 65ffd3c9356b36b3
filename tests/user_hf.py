"""A user's Hugging Face-style code for tests/test_dict_batches.py, referred to by import paths
(``user_hf:TinyLM``, ``user_hf:make_tokens``) as a spec would: a data factory whose samples are
dicts (``input_ids``, ``attention_mask``, ``labels``) and a tiny language model that takes them
as keywords and returns an output with its own ``.loss``, as ``transformers`` models do."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class Tokens(torch.utils.data.Dataset):
    """Dict samples of ``length`` tokens: the label at each position is the next token of a
    counting sequence (``(token + 1) % vocab_size``); ``keys``: the keys each sample has."""

    def __init__(self, input_ids: torch.Tensor, vocab_size: int, keys: tuple[str, ...]):
        self.input_ids, self.vocab_size, self.keys = input_ids, vocab_size, keys

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[i]
        sample = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": (ids + 1) % self.vocab_size,
        }
        return {k: sample[k] for k in self.keys}


def make_tokens(
    n: int = 256, length: int = 8, vocab_size: int = 16, seed: int = 0, keys: tuple[str, ...] | None = None
) -> dict:
    """``n`` training and ``n // 4`` test dict samples from a seeded generator (the same sets on
    every call); ``keys`` leaves some of the keys out (default all three)."""
    keys = tuple(keys or ("input_ids", "attention_mask", "labels"))
    g = torch.Generator().manual_seed(seed)
    train = torch.randint(0, vocab_size, (n, length), generator=g)
    test = torch.randint(0, vocab_size, (n // 4, length), generator=g)
    return {"train": Tokens(train, vocab_size, keys), "test": Tokens(test, vocab_size, keys)}


@dataclass
class LMOutput:
    """What :class:`TinyLM` returns: its loss (``None`` without labels) and its logits."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class TinyLM(nn.Module):
    """Embedding, a hidden layer and a head over the vocabulary at each position; the attention
    mask zeroes the embeddings of masked positions, ``labels`` (``-100``: not counted) give the
    mean cross-entropy per token as ``loss``."""

    def __init__(self, vocab_size: int = 16, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab_size)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None
    ) -> LMOutput:
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        logits = self.head(torch.relu(self.hidden(h)))  # (batch, length, vocab)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return LMOutput(loss, logits)


class DictLM(TinyLM):
    """:class:`TinyLM` returning a dict ``{"loss", "logits"}`` (``return_dict`` style)."""

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor | None]:
        out = super().forward(input_ids, attention_mask, labels)
        return {"loss": out.loss, "logits": out.logits}


class NoLossLM(TinyLM):
    """:class:`TinyLM` that returns its logits alone, never a loss."""

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().forward(input_ids, attention_mask).logits

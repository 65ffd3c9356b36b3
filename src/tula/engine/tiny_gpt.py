"""``tiny_gpt``: a small GPT-style causal decoder, the built-in transformer workload.

Token and learned position embeddings, ``n_layers`` pre-norm blocks (causal self-attention
through :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``, then
a 4x MLP), a final norm and a linear head.  It takes a ``LongTensor`` of token ids of shape
``(batch, length)`` and returns logits of shape ``(batch, vocab_size, length)`` -- the class
dimension second, as :func:`torch.nn.functional.cross_entropy` takes sequences; a tensor of its
own, not a view (the vocabulary contiguous in memory) -- so the
built-in ``cross_entropy`` loss scores it against next-token targets of shape
``(batch, length)`` and evaluation counts top-1 per token.  Given ``labels`` (the next-token
targets, ``-100`` ignored) it returns a :class:`LMOutput` with its own ``loss`` as well, as a
Hugging Face model does: ``train.loss: model`` trains it so (see :mod:`tula.engine.batch`).  The data set it is made for is
:func:`tula.engine.text_data.text_datasets` (bytes of text: ``vocab_size`` 256).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


class _Block(nn.Module):
    """One pre-norm decoder block: causal self-attention, then an MLP, each added back."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (b, heads, t, head_dim)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


@dataclass
class LMOutput:
    """What :class:`TinyGPT` returns given ``labels``: the mean cross-entropy per counted token and the logits."""

    loss: torch.Tensor
    logits: torch.Tensor


class TinyGPT(nn.Module):
    """A GPT-style causal decoder of a few layers.

    Parameters
    ----------
    vocab_size : int
        The number of token ids (256: the bytes of :func:`tula.engine.text_data.text_datasets`).
    n_layers : int
        Decoder blocks.
    d_model : int
        Width of the embeddings and blocks; a multiple of ``n_heads``.
    n_heads : int
        Attention heads per block.
    max_positions : int
        The longest sequence it takes (its learned position embeddings); a longer one is
        refused with a ``ValueError`` naming both lengths.
    dropout : float
        Dropout of the attention weights and the MLP's output in training.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        n_layers: int = 2,
        d_model: int = 128,
        n_heads: int = 4,
        max_positions: int = 128,
        dropout: float = 0.0,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.max_positions = max_positions
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_positions, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor | LMOutput:
        """Logits ``(batch, vocab_size, length)`` of the next token at every position of
        ``tokens`` (``(batch, length)`` token ids); position ``i`` sees tokens ``0..i`` only.
        Given ``labels`` (``(batch, length)``: the next token at each position, ``-100`` not
        counted): an :class:`LMOutput` with the mean cross-entropy per token as ``loss``."""
        if tokens.ndim != 2 or tokens.is_floating_point():
            raise ValueError(
                f"tiny_gpt takes integer token ids of shape (batch, length), not a {tokens.dtype} tensor "
                f"of shape {tuple(tokens.shape)}"
            )
        length = tokens.shape[1]
        if length > self.max_positions:
            raise ValueError(
                f"sequences of {length} tokens are longer than the model's max_positions {self.max_positions}; "
                f"set model.kwargs.max_positions to at least {length} or the data's sequence_length to at most "
                f"{self.max_positions}"
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.drop(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        # (batch, vocab, length) as a tensor of its own, not a view of the head's output: FSDP2 warns
        # on every rank of a module that returns a view.  clone() keeps the head's strides (the
        # vocabulary contiguous), so the loss reads the same memory and its values are unchanged;
        # the head's output is freed at once (nothing saves it), and a step's peak is unchanged
        logits = self.head(self.norm(x)).transpose(1, 2).clone()
        if labels is None:
            return logits
        return LMOutput(F.cross_entropy(logits, labels, ignore_index=-100), logits)

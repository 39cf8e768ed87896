"""Dropout and stochastic depth whose draws are a pure function of a key, so that a client draws the same masks
whether it trains alone (`Trainer.train`) or in a batch of clients (the batched executor, which gives every row its
own key inside `vmap`). torch's dropout draws from one global generator: a batch of clients would share one stream,
so no model with dropout could be batched, and a batched client's masks would depend on who it trained with.

A forward pass's key is `derive_seed(seed, "dropout", stream) + step · GOLDEN` (int64, wrapping): the client's seed,
its batch stream (a task, or "shared" when its tasks label the same inputs) and the local step. Each layer adds its
slot and each element its index; SplitMix64's finalizer (Steele, Lea and Flood, 2014) turns that counter into 64
random bits, whose top 24 decide: an element is dropped when they fall below p · 2²⁴.

With no key set (a forward outside the project's trainers) the layers draw from torch's generator, as
`nn.Dropout` and Swin's drop path do."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from manytask.seeding import derive_seed

_WORD = 1 << 64
GOLDEN = 0x9E3779B97F4A7C15 - _WORD  # SplitMix64's increment, as a signed int64
_MIX = (0xBF58476D1CE4E5B9 - _WORD, 0x94D049BB133111EB - _WORD)
_BITS = 24  # the random bits compared with p: a drop probability is rounded to a multiple of 2⁻²⁴
_SLOT_SHIFT = 40  # a draw's code (slot, call) above any element index of one draw (2⁴⁰ elements)
_SLOT_BITS = 12  # up to 4096 keyed layers; the call's number above them, up to 2¹¹ calls of a layer in one pass
KEYED_ATTENTION = "manytask_keyed"  # the attention implementation whose dropout is keyed


class DropoutKey:
    """The key of the forward pass running now, shared by a model's keyed layers: a 0-dim int64 tensor (one per row
    inside `vmap`), or None when nobody set one. Setting it starts a new pass: a layer called twice in one pass (ViT
    applies its output dropout twice) draws anew each time, from its slot and its call's number."""

    def __init__(self) -> None:
        self._value: Tensor | None = None
        self.generation = 0

    @property
    def value(self) -> Tensor | None:
        return self._value

    @value.setter
    def value(self, value: Tensor | None) -> None:
        self._value = value
        self.generation += 1


def _logical_shift(z: Tensor, bits: int) -> Tensor:
    """`z >> bits` on the 64 bits of an int64 as unsigned (torch shifts signed integers arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def random_bits(key: Tensor, code: int, shape: tuple[int, ...]) -> Tensor:
    """24 random bits per element of `shape` (int64 in [0, 2²⁴)), a function of (key, code, element index) only."""
    counter = torch.arange(math.prod(shape), dtype=torch.int64, device=key.device).view(shape)
    z = key + (counter + ((code << _SLOT_SHIFT) + 1)) * GOLDEN
    z = (z ^ _logical_shift(z, 30)) * _MIX[0]
    z = (z ^ _logical_shift(z, 27)) * _MIX[1]
    return _logical_shift(z ^ _logical_shift(z, 31), 64 - _BITS)


class _KeyedLayer(nn.Module):
    """A random layer: drops with probability p, its draws from the model's key (its slot, its call in the pass)."""

    def __init__(self, p: float, key: DropoutKey, slot: int) -> None:
        super().__init__()
        if slot >= 1 << _SLOT_BITS:
            raise ValueError(f"a model may have at most {1 << _SLOT_BITS} keyed dropout layers")
        self.p, self.key, self.slot = p, key, slot
        self._generation, self._calls = -1, 0

    def keep(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """1/(1 − p) where an element is kept, 0 where it is dropped (probability p, to 2⁻²⁴)."""
        if self._generation != self.key.generation:
            self._generation, self._calls = self.key.generation, 0
        code = self.slot | self._calls << _SLOT_BITS
        self._calls += 1
        kept = random_bits(self.key.value, code, shape) >= round(self.p * (1 << _BITS))
        return kept.to(dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, slot={self.slot}"


class KeyedDropout(_KeyedLayer):
    """`nn.Dropout(p)` drawing its mask from the model's key."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if self.key.value is None:
            return nn.functional.dropout(x, self.p, training=True)
        return x * self.keep(tuple(x.shape), x.dtype)


class KeyedDropPath(_KeyedLayer):
    """Stochastic depth: each sample's residual branch dropped whole with probability p, kept ones scaled by
    1/(1 − p), its draw taken from the model's key."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        if self.key.value is None:
            kept = (torch.rand(shape, dtype=x.dtype, device=x.device) >= self.p).to(x.dtype)
            return x * (kept / (1.0 - self.p))
        return x * self.keep(shape, x.dtype)


def _attention_dropout(module: nn.Module) -> float:
    """The attention-probability dropout a Hugging Face attention module applies (ViT's and Swin's
    `attention_dropout`, CLIP's `dropout`), 0 for any other module."""
    if not hasattr(module, "config") or not hasattr(module, "scaling"):
        return 0.0
    value = getattr(module, "attention_dropout", getattr(module, "dropout", 0.0))
    return float(value) if isinstance(value, (int, float)) else 0.0


def key_dropout(model: nn.Module) -> DropoutKey | None:
    """Make every random layer of `model` keyed, in place: `nn.Dropout` layers, drop-path layers (any module with a
    `drop_prob`), and the attention dropout of Hugging Face models (through the `KEYED_ATTENTION` implementation).
    Returns the key they share, or None when `model` has no random layer."""
    key = DropoutKey()
    slot = 0
    for path, module in list(model.named_modules()):
        if type(module) is nn.Dropout and module.p > 0:
            replacement: nn.Module = KeyedDropout(float(module.p), key, slot)
        elif isinstance(getattr(module, "drop_prob", None), float) and module.drop_prob > 0:
            replacement = KeyedDropPath(module.drop_prob, key, slot)
        elif (attention := _attention_dropout(module)) > 0:
            module.keyed_attention_dropout = KeyedDropout(attention, key, slot)
            slot += 1
            continue
        else:
            continue
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, replacement)
        slot += 1
    if slot == 0:
        return None
    _register_keyed_attention()
    for module in model.modules():
        if hasattr(module, "set_attn_implementation") and any(
                hasattr(m, "keyed_attention_dropout") for m in module.modules()):
            module.set_attn_implementation(KEYED_ATTENTION)
    return key


def dropout_key(model: nn.Module) -> DropoutKey | None:
    """The key `model`'s keyed layers share (None: it has none)."""
    for module in model.modules():
        if isinstance(module, (KeyedDropout, KeyedDropPath)):
            return module.key
    return None


def wrapped(value: int) -> int:
    """An integer reduced to a signed int64, as int64 arithmetic wraps it."""
    value &= _WORD - 1
    return value - _WORD if value >= 1 << 63 else value


def stream_key(seed: int, stream: str, device: torch.device) -> Tensor:
    """Step 0's key of a client's batch stream (a task, or "shared"); step s's adds `wrapped(s · GOLDEN)`."""
    return torch.tensor(derive_seed(seed, "dropout", stream), dtype=torch.int64, device=device)


class PassKeys:
    """A client's keys, set on its model's dropout key before each forward pass of its local training: its seed,
    the pass's batch stream and the step. A model without keyed layers costs one lookup."""

    def __init__(self, model: nn.Module, seed: int, device: torch.device) -> None:
        cached = model.__dict__.get("_manytask_dropout_key", False)
        if cached is False:  # a built model's layers do not change
            cached = model.__dict__["_manytask_dropout_key"] = dropout_key(model)
        self.key: DropoutKey | None = cached
        self.seed, self.device = seed, device
        self.bases: dict[str, Tensor] = {}

    def start(self, stream: str, step: int) -> None:
        if self.key is None:
            return
        base = self.bases.get(stream)
        if base is None:
            base = self.bases[stream] = stream_key(self.seed, stream, self.device)
        self.key.value = base + wrapped(step * GOLDEN)

    def close(self) -> None:
        """No key left set: forward passes outside training draw from torch's generator again."""
        if self.key is not None:
            self.key.value = None


def _keyed_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, **_: object) -> tuple[Tensor, Tensor]:
    """Hugging Face's eager attention (softmax(q·kᵀ·scaling + mask)·v) with the attention probabilities dropped by
    the module's keyed dropout (`dropout` is 0 outside training, when nothing is dropped)."""
    weights = torch.matmul(query, key.transpose(2, 3)) * (query.size(-1) ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout > 0:
        weights = module.keyed_attention_dropout(weights)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _register_keyed_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(KEYED_ATTENTION, _keyed_attention)

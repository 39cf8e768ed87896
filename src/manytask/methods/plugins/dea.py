"""DEA, FedDEA's decoupled aggregation (FedDEA, "Towards Unified Modeling in Federated Multi-Task Learning via
Subspace Decoupling", eqs. 3-5), as a plug-in over any host.

Each client keeps the ⌊ρ·d⌋ entries of its update Δ_k = θ_k − θ_global with the largest |Δ_k| (one top-k over the
whole update of a trained copy, not per layer), zeroes the rest and rescales the kept ones by 1/ρ; the server then
runs its host's rule on reference + Δ̃_k, so FedAvg gives θ + Σ_k w_k Δ̃_k / Σ_k w_k with the weights renormalized
per parameter group (a head only over its task's holders).

Choices the paper leaves open: masking runs on the client, so the upload is sparse (`common.updates` codecs) and
the engine's byte counts show the saving; an array that DEA leaves unchanged (every array at ρ = 1) travels as
the host sent it, so ρ = 1 is exactly the host, bytes included.

The paper aggregates Δ̃ by its eq. 6, a plain weighted sum, and never says what a stateful host (FedDyn's h,
FedACG's momentum) does with it. `rule: host` (the default) feeds Δ̃ to the host's own rule; `rule: paper` moves the
global model by eq. 6 instead, θ ← θ + Σ_k w_k Δ̃_k / Σ_k w_k, and the host's server rule does not run (its state
stays where it started). The 1/ρ rescale does not preserve a top-k update's norm: each client reports
c = ‖Δ̃‖ / ‖Δ‖ over its copies, and the server logs the round's mean as `dea/inflation`, the factor a host's own
`server_lr` needs for the control "host × c" (docs/hosts_and_plugins.md).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.messages import Message
from manytask.methods.base import ClientContext
from manytask.methods.common.updates import (
    Update,
    copy_groups,
    delta,
    densify,
    encode_sparse,
    encode_sparse_on_device,
    squared_norm,
)
from manytask.methods.hosts.server import Rule
from manytask.methods.plugins.base import PluginClient, PluginServer
from manytask.methods.registry import PluginDef, register_plugin
from manytask.registry import Params
from manytask.search_space import Space, uniform
from manytask.seeding import torch_generator

Select = Literal["largest", "smallest", "random"]


class DeaParams(Params):
    # ranges for manytask tune: FedDEA sweeps ρ from 0.1 to 0.9
    SEARCH_SPACE: ClassVar[Space] = {"rho": uniform(0.05, 0.9)}
    # the paper never states its tables' ρ (its Fig. 4 sweeps 10-100 %); 0.5 is what FedDEA's tables here run
    rho: float = Field(default=0.5, gt=0, le=1, description="selection ratio ρ: the fraction of entries kept")
    select: Select = Field(default="largest", description="entries kept: largest |Δ| (DEA), smallest, or random")
    rescale: bool = Field(default=True, description="rescale the kept entries by 1/ρ (recalibration)")
    rule: Literal["host", "paper"] = Field(
        default="host", description="how the server applies Δ̃: the host's own rule (host), or the paper's eq. 6, "
        "θ + the weighted mean of Δ̃, in place of it (paper)",
    )


INFLATION = "dea/inflation"  # a reply's c = ‖Δ̃‖ / ‖Δ‖ (mean over its copies); the round's mean is logged as well


def kept_count(rho: float, size: int) -> int:
    """k = ⌊ρ·d⌋; the tolerance keeps e.g. 0.29·100 = 28.999… at 29."""
    return math.floor(rho * size + 1e-9)


def dea(
    update: Tensor, rho: float, select: Select = "largest", rescale: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Decoupling and recalibration of one flat update (FedDEA, eqs. 3-5): keep k = ⌊ρ·d⌋ entries, zero the rest,
    multiply by 1/ρ. `largest` keeps the largest |Δ| (ties: the lower index, as a stable sort orders them);
    `smallest` and `random` (k entries drawn with `generator`) are the paper's ablations. ρ = 1 returns `update`
    itself. On the host a partition, O(d), in place of a sort (numpy: no kernel launches); on a device a stable sort
    there (no read back)."""
    if not 0 < rho <= 1:
        raise ValueError(f"the selection ratio ρ must lie in (0, 1]; got {rho}")
    if rho == 1:
        return update
    if not update.is_cpu:
        return _dea_on_device(update.detach(), rho, select, rescale, generator)
    flat = update.detach().numpy()
    k = kept_count(rho, flat.size)
    if select == "random":
        if generator is None:
            raise ValueError("a random DEA mask needs a seeded generator")
        kept = np.zeros(flat.size, dtype=bool)
        kept[torch.randperm(flat.size, generator=generator)[:k].numpy()] = True
    else:
        kept = first_of_stable_sort(np.abs(flat), k, largest=select == "largest")
    out = np.zeros_like(flat)
    out[kept] = flat[kept] / rho if rescale else flat[kept]
    return torch.from_numpy(out)


def _dea_on_device(flat: Tensor, rho: float, select: Select, rescale: bool, generator: torch.Generator | None
                   ) -> Tensor:
    """`dea` of a flat update on its device: the same entries kept (a stable sort's first k; a random draw from the
    CPU generator, moved once)."""
    k = kept_count(rho, flat.numel())
    if select == "random":
        if generator is None:
            raise ValueError("a random DEA mask needs a seeded generator")
        chosen = torch.randperm(flat.numel(), generator=generator)[:k].to(flat.device)
    else:
        chosen = torch.sort(flat.abs(), descending=select == "largest", stable=True).indices[:k]
    kept = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device).index_fill_(0, chosen, True)
    return torch.where(kept, flat / rho if rescale else flat, torch.zeros((), dtype=flat.dtype, device=flat.device))


def first_of_stable_sort(magnitude: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """The k entries a stable sort of `magnitude` (descending where `largest`) puts first, as a boolean mask, by one
    partition: every entry beyond the k-th value, then the lowest-indexed entries equal to it."""
    kept = np.zeros(magnitude.size, dtype=bool)
    if k >= magnitude.size:
        kept[:] = True
        return kept
    if k == 0:
        return kept
    if largest:
        threshold = np.partition(magnitude, magnitude.size - k)[magnitude.size - k]
        kept = magnitude > threshold
    else:
        threshold = np.partition(magnitude, k - 1)[k - 1]
        kept = magnitude < threshold
    kept[np.flatnonzero(magnitude == threshold)[: k - int(np.count_nonzero(kept))]] = True
    return kept


class DeaClient(PluginClient[DeaParams]):
    """Uploads each trained copy's parameter deltas after DEA, sparsely; buffers and entries that were not sent
    travel as the host sent them. DEA works where the reply's arrays lie: on the host in numpy (no kernel launches,
    whatever the round's clients), on a device there (the same upload, one read back per reply)."""

    def transform_reply(self, ctx: ClientContext, payload: Message, reply: Message) -> Message:
        if reply.on_device():
            return self._transform_on_device(ctx, payload, reply)
        sent, arrays = payload.on_host().tensors(), reply.tensors()
        changed: dict[str, np.ndarray] = {}
        inflations = []
        for name, keys in copy_groups(arrays).items():
            deltas = {k: v.numpy() for k, v in delta(sent, {k: arrays[k] for k in keys}).items()}  # views
            decoupled, inflation = self.decoupled(deltas, torch_generator(ctx.seed, "dea", name or ""))
            changed.update(decoupled)
            inflations.append(inflation)
        upload = {k: v for k, v in arrays.items() if k not in changed}
        for key, change in changed.items():
            upload.update(encode_sparse(key, change))
        scalars = dict(reply.scalars)
        if self.params.rho < 1 and inflations:  # at ρ = 1 DEA is the host, bytes included
            scalars[INFLATION] = sum(inflations) / len(inflations)
        return Message.from_tensors(upload, scalars=scalars)

    def _transform_on_device(self, ctx: ClientContext, payload: Message, reply: Message) -> Message:
        """`transform_reply` of a reply made on a device, there: the same upload (the same arrays, bytes and
        inflation), read back once (the norms, which arrays changed and their nonzero counts) instead of crossing."""
        sent, arrays = payload.tensors(), reply.tensors()
        copies = []
        for name, keys in copy_groups(arrays).items():
            deltas = delta(sent, {k: arrays[k] for k in keys})
            if not deltas:
                continue
            flat = torch.cat([d.reshape(-1) for d in deltas.values()])
            out = dea(flat, self.params.rho, self.params.select, self.params.rescale,
                      torch_generator(ctx.seed, "dea", name or ""))
            pieces = dict(zip(deltas, torch.split(out, [d.numel() for d in deltas.values()]), strict=True))
            copies.append((deltas, pieces, flat, out))
        if not copies:
            return reply
        reads = torch.stack([t for deltas, pieces, flat, out in copies for t in (
            squared_norm(flat), squared_norm(out),
            *((pieces[k] != d.reshape(-1)).any().double() for k, d in deltas.items()),
            *((pieces[k] != 0).sum().double() for k in deltas))]).tolist()  # the one read
        changed: dict[str, dict[str, Tensor]] = {}
        inflations = []
        for deltas, pieces, _, _ in copies:
            before, after, *flags = reads[: 2 + 2 * len(deltas)]
            reads = reads[2 + 2 * len(deltas):]
            inflations.append(math.sqrt(after) / math.sqrt(before) if before > 0 else 1.0)
            for (key, old), moved, count in zip(deltas.items(), flags[: len(deltas)], flags[len(deltas):],
                                                strict=True):
                if moved:
                    changed[key] = encode_sparse_on_device(key, pieces[key].reshape(old.shape), int(count))
        upload = {k: v for k, v in arrays.items() if k not in changed}
        for arrays_of_key in changed.values():
            upload.update(arrays_of_key)
        scalars = dict(reply.scalars)
        if self.params.rho < 1:
            scalars[INFLATION] = sum(inflations) / len(inflations)
        return Message.from_tensors(upload, scalars=scalars)

    def decoupled(self, deltas: dict[str, np.ndarray], generator: torch.Generator
                  ) -> tuple[dict[str, np.ndarray], float]:
        """One copy's deltas, flattened in key order, through `dea`: (Δ̃ of every array that DEA changed, the norm
        inflation c = ‖Δ̃‖ / ‖Δ‖, 1 for a zero update)."""
        if not deltas:
            return {}, 1.0
        flat = np.concatenate([d.reshape(-1) for d in deltas.values()])
        out = dea(torch.from_numpy(flat), self.params.rho, self.params.select, self.params.rescale, generator).numpy()
        before, after = (math.sqrt(float(np.dot(v, v))) for v in (flat.astype(np.float64), out.astype(np.float64)))
        inflation = after / before if before > 0 else 1.0
        pieces = np.split(out, np.cumsum([d.size for d in deltas.values()])[:-1])
        return {key: new.reshape(old.shape) for (key, old), new in zip(deltas.items(), pieces, strict=True)
                if not np.array_equal(new, old.reshape(-1))}, inflation


class DeaServer(PluginServer[DeaParams]):
    """Restores each sparse reply to reference + Δ̃ against what its client was sent; the host aggregates, or eq. 6
    does (`rule: paper`). Logs the round's mean norm inflation c."""

    device_ready = True

    def restore_reply(self, client: int, reply: Message) -> Message:
        return Message.from_tensors(densify(reply.tensors(), self.host.sent[client]), scalars=reply.scalars)

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        by_client = {u.client: float(u.scalars[INFLATION]) for u in updates if INFLATION in u.scalars}
        if by_client:
            self.log[INFLATION] = sum(by_client.values()) / len(by_client)
        return updates

    def rule(self) -> Rule | None:
        return self.host.average_updates if self.params.rule == "paper" else None


register_plugin(
    "dea", PluginDef(DeaClient, DeaServer), DeaParams,
    "FedDEA's DEA: each client keeps its top-ρ update entries by magnitude, rescaled by 1/ρ, uploaded sparsely",
)

"""FL + TaLoS with disjoint parameter partitions (the paper's variant A, shared/specs/talos_fl.md):

1. calibration: every client sends its mask once (packed bits on the wire); the server keeps the (1 − ρ*) fraction of
   scored entries most clients call least sensitive and splits it, in a seeded random order, into one subset per
   client, mutually exclusive and together exhaustive (talos/partition.py);
2. each round a sampled client receives the model and its subset, trains only that subset with SparseSGDM, and
   uploads δ_k on its subset alone (|θ̂_k| values, about 1/N of the kept entries);
3. the server places them: θ̂ ← θ̂ + ∪_k δ_k (eq. 5; no averaging, the subsets never overlap).
The server's only extra state is the kept mask: the partition is recomputed from it and the run seed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from manytask.errors import ManytaskError, clipped
from manytask.messages import Message
from manytask.methods.base import ClientContext, MethodDef, Setup
from manytask.methods.common.wire import counts_problem, fit_scalars, mean_train_losses
from manytask.methods.hosts.base import TrainedCopy
from manytask.methods.registry import SPARSE, register_method
from manytask.methods.talos.mask import Masks
from manytask.methods.talos.partition import assemble, partition, subset_size, subset_values, vote_kept
from manytask.methods.talos.program import (
    CALIBRATION,
    HEAD_ONLY,
    TalosClient,
    TalosParams,
    TalosServer,
    fractions_problem,
    trainable_fractions,
)
from manytask.seeding import derive_seed

MASK_PREFIX = "mask/"  # the calibration reply: the client's mask
OWNED_PREFIX = "owned/"  # in each training payload: the client's subset
VALUES = "delta_values"  # the upload: δ_k on the client's subset, in the subset's order
KEPT = "kept"  # server part: the voted kept entries


class PartitionClient(TalosClient):
    def calibration_reply(self, ctx: ClientContext, masks: Masks) -> Message:
        """The mask itself goes to the server (bool arrays travel as packed bits); the client keeps nothing."""
        return Message.from_tensors(masks, MASK_PREFIX, {**fit_scalars(ctx.data, {}), **trainable_fractions(masks)})

    def trainable_mask(self, ctx: ClientContext, copy: TrainedCopy) -> Masks:
        """The subset the server assigned to this client."""
        missing = [name for name in self.scored if OWNED_PREFIX + name not in copy.received]
        if missing:
            raise ManytaskError(f"client {ctx.client_id}: the server sent no subset for {missing[0]}.")
        return {name: copy.received[OWNED_PREFIX + name].bool() for name in self.scored}

    def split_upload(self, ctx: ClientContext, copy: TrainedCopy, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """In the sparse phase, δ_k on the client's subset alone: trained minus received values, on the host."""
        if self.heads_phase(ctx):
            return super().split_upload(ctx, copy, state)
        owned = self.trainable_mask(ctx, copy)
        trained, sent = subset_values(state, owned), subset_values(copy.received, owned)
        return {VALUES: torch.from_numpy(trained.numpy() - sent.numpy())}


class PartitionServer(TalosServer):
    def __init__(self, setup: Setup, params: TalosParams) -> None:
        super().__init__(setup, params)
        self.owned: list[Masks] | None = None  # per client id; derived from the kept mask

    def calibration_problem(self, client: int, reply: Message) -> str | None:
        """The mask itself: one boolean array per scored parameter, of its shape."""
        expected = {MASK_PREFIX + name: self.global_state[name].shape for name in self.scored}
        if set(reply.arrays) != set(expected):
            return f"a calibration reply carries the masks {clipped(sorted(expected))} and nothing else"
        for key, array in reply.tensors().items():
            if array.dtype != torch.bool or array.shape != expected[key]:
                return f"reply's '{key}' is {array.dtype} {tuple(array.shape)}, not bool {tuple(expected[key])}"
        return counts_problem(client, reply, self.setup.holdings[client]) or fractions_problem(reply, self.scored)

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """In the sparse phase: exactly the client's subset of values, in the scored parameters' dtype."""
        if self.step.name in (HEAD_ONLY, CALIBRATION):
            return super().reply_problem(client, reply)
        expected = subset_size(self.subsets()[client])
        dtype = self.global_state[self.scored[0]].dtype
        if set(reply.arrays) != {VALUES}:
            return f"a sparse-phase reply carries '{VALUES}' and nothing else"
        values = reply.tensor(VALUES)
        if values.shape != (expected,) or values.dtype != dtype:
            return f"client {client} sent {values.dtype} {tuple(values.shape)} values for a subset of {expected}"
        return counts_problem(client, reply, self.setup.holdings[client])

    def aggregate_calibration(self, replies: Mapping[int, Message]) -> dict[str, float]:
        """Vote, keep the top (1 − ρ*), and record how much of each parameter is kept."""
        kept = vote_kept([reply.tensors(MASK_PREFIX) for reply in replies.values()], self.params.sparsity)
        self.parts[KEPT] = kept
        self.owned = None
        kept_fractions = {f"kept/{k}": v for k, v in trainable_fractions(kept).items()}
        return {**super().aggregate_calibration(replies), **kept_fractions}

    def subsets(self) -> list[Masks]:
        """Client k's subset of the kept entries (seeded by the run, so it survives a resume unchanged)."""
        if self.owned is None:
            if KEPT not in self.parts:
                raise ManytaskError("the partition variant has no kept mask: no client replied in calibration.")
            kept = {name: self.parts[KEPT][name] for name in self.scored}  # model order (a checkpoint sorts keys)
            self.owned = partition(kept, len(self.setup.holdings), derive_seed(self.setup.seed, "talos"))
        return self.owned

    def payload_for(self, client: int) -> Message:
        message = super().payload_for(client)
        if self.step.name in (HEAD_ONLY, CALIBRATION):
            return message
        tensors = {**message.tensors(), **{OWNED_PREFIX + k: v for k, v in self.subsets()[client].items()}}
        return Message.from_tensors(tensors)

    def aggregate_sparse(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        """θ̂ ← θ̂ + ∪_k δ_k (eq. 5)."""
        received = {c: r for c, r in replies.items() if r is not None}
        owned = self.subsets()
        uploads = {client: reply.tensor(VALUES) for client, reply in received.items()}  # screened: `reply_problem`
        scored = {name: self.global_state[name] for name in self.scored}
        self.global_state.update(assemble(scored, uploads, owned))
        return mean_train_losses(list(received.values()))

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        super().load_state_dict(state)
        self.owned = None


register_method(
    "talos-partition", MethodDef(PartitionClient, PartitionServer, family=SPARSE), TalosParams,
    "FL + TaLoS, disjoint partitions: voted masks split into one subset per client; clients upload only theirs",
)

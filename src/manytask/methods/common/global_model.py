"""`GlobalModel`: the one model a server sends its clients and takes back trained, held by the servers that need
one (the hosts, pFedMe, MAS's stages) rather than inherited: its state, each task set's payload, what each client
was sent this round (the references its reply is read against), the checks of a reply against them, the divergence
guard (`common/guard.py`), and the replies read as `Update`s."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from pydantic import Field
from torch import Tensor

from manytask.errors import clipped
from manytask.messages import Message
from manytask.methods.base import ServerProgram, Setup
from manytask.methods.common.aggregation import Weight, fedavg_weights, weighted_average
from manytask.methods.common.guard import far_beyond_median, update_norms
from manytask.methods.common.updates import Update, copy_groups, reference_key
from manytask.methods.common.wire import counts_problem, spec_problem, task_sizes
from manytask.models.multitask import task_of_key
from manytask.registry import Params

PART_PREFIX = "part/"  # a server's named state beyond its global model, in its checkpoint: part/<name>/<key>
GUARD = 100.0  # far above the spread of honest updates (clients with 100× the data of the median one included)
# a copy's aggregation weight per parameter: (client, its trained keys, its task sizes) -> weight per key
WeightsOf = Callable[[int, list[str], dict[str, int]], dict[str, Weight]]


class GuardParams(Params):
    """What every server that aggregates (reference, trained) updates takes: the divergence guard."""

    guard: float = Field(
        default=GUARD, ge=0, allow_inf_nan=False, description="divergence guard: refuse a reply whose update norm "
        "exceeds guard × the round's median (0: off; needs 3 replies)",
    )


class GlobalModel:
    def __init__(self, setup: Setup, state: dict[str, Tensor], guard: float) -> None:
        self.setup = setup
        self.state = state
        self.guard = guard  # refuse replies whose update exceeds guard × the round's median (0: off)
        self.sent: dict[int, dict[str, Tensor]] = {}  # this round's payloads: the references of the replies
        self.payloads: dict[frozenset[str], Message] = {}  # payload per task set, until the model changes

    def changed(self) -> None:
        """The state has changed (or will): payloads are built anew."""
        self.payloads = {}

    def payload(self, client: int) -> Message:
        """The shared parameters and the heads of the client's tasks; one message per task set until the model
        changes (the engine serializes it for every client that gets it)."""
        tasks = frozenset(self.setup.holdings[client])
        if tasks not in self.payloads:
            self.payloads[tasks] = Message.from_tensors(
                {k: v for k, v in self.state.items() if (task := task_of_key(k)) is None or task in tasks})
        return self.payloads[tasks]

    def send(self, payloads: dict[int, Message]) -> dict[int, Message]:
        """Record what each client is sent this round (one set of views per message); the payloads, unchanged."""
        self.sent = {c: p.tensors() for c, p in payloads.items()}
        return payloads

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """A reply holds trained copies of what its client was sent: every array's reference entry was sent to it,
        with the same shape and dtype; it reports the sample count of every task its client holds (and of no
        other), and a per-task copy is of one of those tasks."""
        problem = counts_problem(client, reply, self.setup.holdings[client])
        if problem is not None:
            return problem
        sent, sizes = self.sent.get(client, {}), task_sizes(reply)
        for name, array in reply.tensors().items():
            reference = sent.get(reference_key(name))
            if reference is None:
                return f"reply carries '{clipped(name)}', which was not sent to client {client}"
            if array.shape != reference.shape or array.dtype != reference.dtype:  # the spec only for the sentence
                return spec_problem(name, array, (tuple(reference.shape), reference.dtype), "was sent")
        copies = [task for task in copy_groups(reply.arrays) if task is not None and task not in sizes]
        return f"reply carries a copy for task '{clipped(copies[0])}' without its sample count" if copies else None

    def round_problems(self, replies: Mapping[int, Message]) -> dict[int, str]:
        """The divergence guard: replies whose update is far beyond the round's median."""
        if self.guard <= 0:
            return {}
        norms = update_norms({c: self.sent.get(c, {}) for c in replies}, {c: r.tensors() for c, r in replies.items()})
        return far_beyond_median(norms, self.guard)

    def average(self, updates: list[Update]) -> None:
        """FedAvg: θ_k ← Σ_n w_{n,k} θ_{n,k} / Σ_n w_{n,k} over the copies that trained k."""
        self.state.update(weighted_average([u.trained for u in updates], [u.weights for u in updates]))

    def read_updates(self, replies: Mapping[int, Message], weights: WeightsOf) -> list[Update]:
        """Every trained copy in the replies (sorted by client, copies by task) against what its client was sent,
        weighted by `weights`; entries that were not sent are ignored."""
        updates = []
        for client, reply in replies.items():
            tensors, sizes, sent = reply.tensors(), task_sizes(reply), self.sent[client]
            for task, keys in copy_groups(tensors).items():
                copy_sizes = sizes if task is None else {task: sizes[task]}
                trained = {reference_key(k): tensors[k] for k in keys if reference_key(k) in sent}
                updates.append(Update(client, copy_sizes, {k: sent[k] for k in trained}, trained,
                                      weights(client, list(trained), copy_sizes), dict(reply.scalars), task))
        return updates


def fedavg_weights_of(client: int, keys: list[str], sizes: dict[str, int]) -> dict[str, Weight]:
    """FedAvg's `WeightsOf`: task size for a head, total size otherwise (`fedavg_weights`)."""
    return dict(fedavg_weights(keys, sizes))


def with_parts(state: Mapping[str, Tensor], parts: Mapping[str, Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """A server's checkpoint: its global model and its named parts under `PART_PREFIX`."""
    out = dict(state)
    for part, tensors in parts.items():
        out.update({f"{PART_PREFIX}{part}/{k}": v for k, v in tensors.items()})
    return out


def split_parts(checkpoint: Mapping[str, Tensor], names: Iterable[str]
                ) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
    """Inverse of `with_parts`, copied: (the global model, its parts: each of `names`, empty where the checkpoint
    has none of it, and any other it has)."""
    state = {k: v.clone() for k, v in checkpoint.items() if not k.startswith(PART_PREFIX)}
    parts: dict[str, dict[str, Tensor]] = {part: {} for part in names}
    for key, value in checkpoint.items():
        if key.startswith(PART_PREFIX):
            part, _, name = key[len(PART_PREFIX):].partition("/")
            parts.setdefault(part, {})[name] = value.clone()
    return state, parts


P = TypeVar("P", bound=GuardParams)


class GlobalModelServer(ServerProgram[P]):
    """A server that holds a `GlobalModel` (`self.model`, which its constructor sets) and named state beyond it
    (`self.parts`): the reply checks and the divergence guard are the model's, and its checkpoint is the model's
    state with its parts (`with_parts`)."""

    supports_device = True
    model: GlobalModel
    parts: dict[str, dict[str, Tensor]]

    @property
    def global_state(self) -> dict[str, Tensor]:
        return self.model.state

    @global_state.setter
    def global_state(self, state: dict[str, Tensor]) -> None:
        self.model.state = state

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        self.model.changed()
        return dict(self.model.send({c: self.payload_for(c) for c in clients}))

    def payload_for(self, client: int) -> Message:
        """The shared parameters and the heads of the client's tasks (`GlobalModel.payload`)."""
        return self.model.payload(client)

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """A reply holds trained copies of what its client was sent (`GlobalModel.reply_problem`)."""
        return self.model.reply_problem(client, reply)

    def round_problems(self, replies: Mapping[int, Message]) -> dict[int, str]:
        """The divergence guard: replies whose update is far beyond the round's median."""
        return self.model.round_problems(replies)

    def state_dict(self) -> dict[str, Tensor]:
        return with_parts(self.model.state, self.parts)

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.model.changed()
        self.model.state, self.parts = split_parts(state, self.parts)

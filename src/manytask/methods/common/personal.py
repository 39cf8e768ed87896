"""Shared pieces of the personalized methods (SFMTL-Graph's setting, spec: shared/specs/sfmtl_graph.md): every
client holds one task, keeps its own model in client state, and the server may owe each client its own payload.

Methods that compare or average whole models across clients (pFedMe, FedU) need one architecture for all of
them, so a client's model travels in ROLE form (`models.multitask.to_role`): the backbone plus `head.*`, its only head,
whatever its task's name. Every client then starts from one common model (`Setup.common_start`), as in the pFedMe
and FedU papers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from manytask.devices import CPU
from manytask.errors import ManytaskError
from manytask.messages import Message
from manytask.methods.base import ServerProgram, Setup
from manytask.models.multitask import MultiTaskModel, load_state
from manytask.registry import Params

PENDING = "pending/"


def only_task(setup: Setup, client: int, method: str) -> str:
    """The one task `client` holds; a ManytaskError naming the client and the method otherwise."""
    tasks = list(setup.holdings[client])
    if len(tasks) != 1:
        raise ManytaskError(f"{method} needs one task per client; client {client} holds {len(tasks)}.")
    return tasks[0]


def check_shared_head(setup: Setup, who: str = "shared_head") -> None:
    """One head shared by every client (whole models compared or averaged across clients) needs one task per
    client and one head shape for every task."""
    for client, tasks in setup.holdings.items():
        if len(tasks) != 1:
            raise ManytaskError(f"{who} needs one task per client; client {client} holds {len(tasks)}.")
    outputs = sorted({spec.num_outputs for spec in setup.specs.values()})
    if len(outputs) > 1:
        raise ManytaskError(f"{who} needs every task to have the same number of outputs; got {outputs}.")


def personal_model(setup: Setup, *layers: Mapping[str, Tensor], device: torch.device = CPU) -> MultiTaskModel:
    """The initial model overlaid with `layers` in order, later ones winning (e.g. a starting point, the client's
    state, then what the server sent it), on `device`. A key the model does not have is an error, not silently
    dropped. The model is built and loaded on the CPU, whatever device the layers are on, then moved: its
    initial values do not depend on the device."""
    merged: dict[str, Tensor] = {}
    for layer in layers:
        merged.update(layer)
    model = setup.build_model()
    unexpected = load_state(model, merged)
    if unexpected:
        raise KeyError(f"not parameters of the model: {sorted(unexpected)}")
    return model.to(device)


def graph_steps(setup: Setup, round_index: int, clients: Sequence[int]) -> list[float]:
    """The server step η_g = client lr × local epochs of each client (SFMTL-Graph spec step 6; FedU), where the
    epochs are those the client's training amounts to: `local_epochs`, or `local_steps` over one epoch's steps
    of that client (`Trainer.epochs_for`)."""
    lr, trainer = setup.train.lr_at(round_index, setup.rounds), setup.trainer()
    return [lr * trainer.epochs_for(setup.holdings[c]) for c in clients]


class PerClientPayloadServer(ServerProgram):
    """A server that owes each client its own payload (set in `aggregate_fit`), sent when the client is next
    sampled or evaluated; clients it owes nothing get None. The pending payloads are its crash-safe state,
    stored as `pending/<client>/<name>`."""

    supports_device = True

    def __init__(self, setup: Setup, params: Params) -> None:
        super().__init__(setup, params)
        self.pending: dict[int, dict[str, Tensor]] = {}

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        return {c: self.payload(c) for c in clients}

    def configure_evaluate(self, clients: list[int]) -> dict[int, Message | None]:
        return {c: self.payload(c) for c in clients}

    def payload(self, client: int) -> Message | None:
        return Message.from_tensors(self.pending[client]) if client in self.pending else None

    def state_dict(self) -> dict[str, Tensor]:
        return {f"{PENDING}{c}/{k}": v for c, tensors in self.pending.items() for k, v in tensors.items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.pending = {}
        for key, value in state.items():
            client, _, name = key[len(PENDING):].partition("/")
            self.pending.setdefault(int(client), {})[name] = value.clone()

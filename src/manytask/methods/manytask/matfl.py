"""MaT-FL (Cai et al., 2023): many-task FL by grouping clients. Each round the server compares the clients'
updates of the shared parameters by cosine similarity, groups clients whose updates agree (average-linkage
agglomerative clustering with a similarity threshold), and aggregates inside each group only. Every client keeps
its own model on the server, so evaluation is per client: each holder's model on its task's test set. Clients are
the hosts' (`HostClient`): they train what they are sent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.client.trainer import TaskData, evaluate
from manytask.messages import Message
from manytask.methods.base import MethodDef, Metrics, ServerProgram, Setup
from manytask.methods.common.aggregation import fedavg_weights, weighted_average
from manytask.methods.common.wire import array_specs, arrays_problem, counts_problem, mean_train_losses, task_sizes
from manytask.methods.hosts.base import HostClient, HostParams
from manytask.methods.registry import MANY_TASK, register_method
from manytask.models.multitask import load_state, task_of_key, trainable_state
from manytask.search_space import Space, uniform

CLIENT_PREFIX = "client/"


class MatflParams(HostParams):
    # ranges for manytask tune: the cosine that joins clients
    SEARCH_SPACE: ClassVar[Space] = {"threshold": uniform(0.0, 0.9)}
    threshold: float = Field(default=0.5, ge=-1, le=1, description="cosine similarity that joins clients")


def cosine_similarity(updates: Tensor) -> Tensor:
    """[n, d] updates -> [n, n] cosine similarities (0 for a zero update)."""
    normed = updates / updates.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return normed @ normed.T


def group_clients(similarity: Tensor, threshold: float) -> list[list[int]]:
    """Groups of row indices: average-linkage clusters whose members' mean similarity stays above `threshold`."""
    n = len(similarity)
    if n == 1:
        return [[0]]
    distance = (1 - similarity.double()).clamp_min(0).cpu().numpy()  # one read: the clustering runs on the host
    np.fill_diagonal(distance, 0.0)
    from sklearn.cluster import AgglomerativeClustering  # here: importing sklearn slows every start-up

    labels = AgglomerativeClustering(
        n_clusters=None, metric="precomputed", linkage="average", distance_threshold=1 - threshold
    ).fit_predict(distance)
    groups: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(int(label), []).append(index)
    return sorted(groups.values())


class MatflServer(ServerProgram):
    """Keeps each client's model; aggregates where they lie (the clustering reads the similarities once)."""

    supports_device = True

    def __init__(self, setup: Setup, params: MatflParams) -> None:
        super().__init__(setup, params)
        initial = trainable_state(setup.build_model())
        self.models = {c: {k: v for k, v in initial.items() if task_of_key(k) in (None, *tasks)}
                       for c, tasks in setup.holdings.items()}

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        return {c: Message.from_tensors(self.models[c]) for c in clients}

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """A MaT-FL reply is the client's model trained: exactly the arrays it was sent, of their shapes and dtypes,
        and the counts of exactly its tasks."""
        return (counts_problem(client, reply, list(self.setup.holdings[client]))
                or arrays_problem(reply, array_specs(self.models[client])))

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        received = {c: r for c, r in replies.items() if r is not None}
        if not received:
            return {}
        clients = list(received)
        updates = torch.stack([self._shared_update(c, received[c]) for c in clients])
        groups = [[clients[i] for i in g] for g in group_clients(cosine_similarity(updates), self.params.threshold)]
        for group in groups:
            tensors = [received[c].tensors() for c in group]
            weights = [fedavg_weights(list(t), task_sizes(received[c])) for t, c in zip(tensors, group, strict=True)]
            merged = weighted_average(tensors, weights)
            for c in group:
                self.models[c].update({k: v for k, v in merged.items() if k in self.models[c]})
        return {"groups": float(len(groups)), **mean_train_losses(list(received.values()))}

    def _shared_update(self, client: int, reply: Message) -> Tensor:
        sent = self.models[client]
        shared = [k for k in sent if task_of_key(k) is None]
        return torch.cat([(reply.tensor(k) - sent[k]).reshape(-1) for k in shared])

    def evaluate(self, test: TaskData) -> Metrics:
        """Mean over each task's holders of the holder's own model on the task's test set."""
        per_task: dict[str, list[dict[str, float]]] = {}
        for client, state in self.models.items():
            model = self.setup.build_model()
            load_state(model, state)
            for task in self.setup.holdings[client]:
                per_task.setdefault(task, []).append(evaluate(model, self.setup.specs[task], *test[task]))
        return {t: {m: sum(r[m] for r in rows) / len(rows) for m in rows[0]} for t, rows in per_task.items()}

    def state_dict(self) -> dict[str, Tensor]:
        return {f"{CLIENT_PREFIX}{c}/{k}": v for c, state in self.models.items() for k, v in state.items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        models: dict[int, dict[str, Tensor]] = {}
        for key, value in state.items():
            client, _, name = key[len(CLIENT_PREFIX):].partition("/")
            models.setdefault(int(client), {})[name] = value.clone()
        self.models = models


register_method(
    "matfl", MethodDef(HostClient, MatflServer, family=MANY_TASK), MatflParams,
    "MaT-FL: clients grouped by cosine similarity of their updates, aggregation inside groups",
)

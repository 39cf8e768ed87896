"""MaTU: many-task federated fine-tuning via unified task vectors (spec: shared/specs/matu.md).

Clients train one adapter copy per held task, unify the task vectors into one vector plus a bit mask and a
rescaler per task, and upload those (masks as packed bits). The server keeps ONE vector per task (never per
client): it aggregates same-task contributions under agreement masks, adds similar tasks' vectors (sign
similarity, top-κ above ε), and sends each client the unification of its tasks' vectors. `unify: false` is an
ablation that sends every task's vector as it is, both ways. The math lives in `matu_math` and `matu_aggregate` as
pure functions; this module only moves data in and out of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from manytask.client.trainer import TaskData, TrainReport, evaluate
from manytask.execution.plan import ClientPlan, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, MethodDef, Metrics, ServerProgram, Setup
from manytask.methods.common.aggregation import fedavg_weights, weighted_average
from manytask.methods.common.template import program_template
from manytask.methods.common.wire import (
    LOSS_PREFIX,
    SIZE_PREFIX,
    array_specs,
    arrays_problem,
    counts_problem,
    task_sizes,
)
from manytask.methods.manytask.matu_aggregate import aggregate
from manytask.methods.manytask.matu_math import (
    DEFAULT_EPS,
    DEFAULT_KAPPA,
    DEFAULT_RHO,
    reconstruct,
    task_similarity,
    unify,
)
from manytask.methods.registry import MANY_TASK, register_method
from manytask.metric_names import CLIENT_VIEW_PREFIX, similarity_key
from manytask.models import ParamSpace
from manytask.models.multitask import MultiTaskModel, head_prefix, load_state, task_of_key, trainable_state
from manytask.registry import Params
from manytask.search_space import Space, uniform
from manytask.seeding import derive_seed

UNIFIED = "unified"
MASK_PREFIX = "mask/"
RESCALER_PREFIX = "rescaler/"
VECTOR_PREFIX = "vector/"


class MatuParams(Params):
    # ranges for manytask tune: around ρ 0.4 and ε 0.5
    SEARCH_SPACE: ClassVar[Space] = {"rho": uniform(0.1, 0.9), "eps": uniform(0.1, 0.9)}
    rho: float = Field(default=DEFAULT_RHO, ge=0, le=1, description="agreement threshold ρ")
    eps: float = Field(default=DEFAULT_EPS, ge=0, le=1, description="similarity threshold ε")
    kappa: int | None = Field(default=DEFAULT_KAPPA, ge=0, description="at most κ neighbour tasks (None: all)")
    cross_task: Literal["mean", "sum", "none", "uniform"] = "mean"
    unify: bool = Field(
        default=True,
        description="unify a client's task vectors into one vector + masks + rescalers (False: the ablation that "
        "sends one vector per task both ways, to measure what unification costs)",
    )


class TaskVectorSpace:
    """The shared trainable parameters (the adapters) as one vector relative to their initial values."""

    def __init__(self, setup: Setup) -> None:
        model = setup.build_model()
        self.space = ParamSpace.of(model, lambda n: task_of_key(n) is None and model.get_parameter(n).requires_grad)
        self.initial = self.space.flatten(model)
        self.heads = {k: v for k, v in trainable_state(model).items() if task_of_key(k) is not None}

    def model_with(self, setup: Setup, vector: Tensor, heads: Mapping[str, Tensor]) -> MultiTaskModel:
        """θ_p + τ in the adapters, plus the given heads."""
        model = setup.build_model()
        self.space.assign(model, self.initial.to(vector.device) + vector)  # the vector may lie on a device
        load_state(model, heads)
        return model

    def vector_of(self, model: MultiTaskModel) -> Tensor:
        return self.space.flatten(model) - self.initial


Unification = tuple[Tensor, Tensor, list[float]]  # τ_uni [d], masks [T, d], rescalers λ^t (read to the host)


def unification(vectors: Mapping[str, Tensor]) -> Unification:
    """`unify` of a client's task vectors, in the mapping's task order."""
    unified, masks, rescalers = unify(torch.stack(list(vectors.values())))
    return unified, masks, rescalers.tolist()


def unified_message(tasks: list[str], unified: Unification, extra: Mapping[str, Tensor], scalars: dict) -> Message:
    """The unification of per-task vectors as sent on the wire: τ_uni, one bit mask and a rescaler per task."""
    vector, masks, rescalers = unified
    arrays: dict[str, Tensor] = {UNIFIED: vector, **extra}
    arrays.update({MASK_PREFIX + t: masks[i] for i, t in enumerate(tasks)})
    scalars = {**scalars, **{RESCALER_PREFIX + t: rescalers[i] for i, t in enumerate(tasks)}}
    return Message.from_tensors(arrays, scalars=scalars)


def task_vectors_message(
    vectors: Mapping[str, Tensor], extra: Mapping[str, Tensor], scalars: dict, unified: bool
) -> Message:
    """Per-task vectors on the wire: unified (MaTU) or, for the ablation, one float vector per task."""
    if unified:
        return unified_message(list(vectors), unification(vectors), extra, scalars)
    return Message.from_tensors({**{VECTOR_PREFIX + t: v for t, v in vectors.items()}, **extra}, scalars=scalars)


def batched_unifications(vectors: Tensor, counts: list[int]) -> list[Unification]:
    """`unification` of consecutive row groups of `vectors` ([Σ counts, d]: a client's task vectors after the
    previous client's), the clients with the same number of tasks unified in one batched pass."""
    starts = [sum(counts[:i]) for i in range(len(counts))]
    out: dict[int, Unification] = {}
    for size in sorted(set(counts)):
        clients = [c for c, n in enumerate(counts) if n == size]
        rows = torch.tensor([starts[c] + i for c in clients for i in range(size)], device=vectors.device)
        unified, masks, rescalers = unify(vectors.index_select(0, rows).view(len(clients), size, -1))
        for position, (client, scales) in enumerate(zip(clients, rescalers.tolist(), strict=True)):
            out[client] = unified[position], masks[position], scales
    return [out[client] for client in range(len(counts))]


def received_vectors(message: Message, tasks: list[str]) -> dict[str, Tensor]:
    """Each task's vector as a message carries it: λ^t · m^t ⊙ τ_uni when unified, else the vector itself."""
    if UNIFIED not in message.arrays:
        return {t: message.tensor(VECTOR_PREFIX + t) for t in tasks}
    unified = message.tensor(UNIFIED)
    return {t: reconstruct(unified, message.tensor(MASK_PREFIX + t), float(message.scalars[RESCALER_PREFIX + t]))
            for t in tasks}


class MatuClient(ClientProgram):
    """Trains one copy per held task, each from its task's received vector and head on that task alone, and uploads
    the unification of the trained vectors. Its round is one plan per copy, which the executor batches with the
    other clients' copies. On a device, the copies train there and are unified there; the vectors and masks cross
    to the host as the reply is made."""

    supports_device = True

    @cached_property
    def space(self) -> TaskVectorSpace:
        return TaskVectorSpace(self.setup)

    @cached_property
    def initial(self) -> Tensor:
        """θ_p of the adapters, flattened, on the program's device (where trained vectors are taken from it)."""
        return self.space.initial.to(self.device)

    def initial_on(self, device: torch.device) -> Tensor:
        """θ_p where a received vector lies: the program's device (in-process, payloads stay on the server's
        device), or the host (a payload decoded from bytes)."""
        return self.initial if device == self.initial.device else self.space.initial.to(device)

    template = program_template()

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        assert payload is not None, "MaTU clients always receive their tasks' vectors"
        tasks = list(ctx.data)
        starts = received_vectors(payload, tasks)
        received_heads = {k: v for k, v in payload.tensors().items() if task_of_key(k) is not None}
        trained, reports = {}, {}
        for task in tasks:
            model = self.space.model_with(self.setup, starts[task], received_heads).to(self.device)
            reports[task] = self.setup.trainer().train(
                model, {task: ctx.data[task]}, derive_seed(ctx.seed, task), ctx.round_index, self.setup.rounds
            )
            trained[task] = trainable_state(model, [task])
        return self.reply(ctx, trained, reports)

    def plan(self, ctx: ClientContext, payload: Message | None) -> list[ClientPlan]:
        return self.plan_many([ctx], [payload])[0]

    def plan_many(self, ctxs: Sequence[ClientContext], payloads: Sequence[Message | None]
                  ) -> list[list[ClientPlan]]:
        """One plan per held task's copy, from its task's received vector; the clients sent the same payload (those
        of one task set) reconstruct their starts from it once."""
        trainer = self.setup.trainer()
        starts: dict[tuple[int, tuple[str, ...]], dict[str, dict[str, Tensor]]] = {}
        plans = []
        for ctx, payload in zip(ctxs, payloads, strict=True):
            assert payload is not None, "MaTU clients always receive their tasks' vectors"
            tasks = list(ctx.data)
            key = id(payload), tuple(tasks)  # every payload lives through the call: ids are not reused
            if key not in starts:
                received = received_vectors(payload, tasks)
                # views: the executor stacks (copies) the starts
                starts[key] = {t: self.space.space.views(self.initial_on(received[t].device) + received[t])
                               for t in tasks}
            received_heads = {k: v for k, v in payload.tensors().items() if task_of_key(k) is not None}
            plans.append([ClientPlan(self.template.model, trainer, ctx.round_index, self.setup.rounds, {},
                                     {task: ctx.data[task]}, self.template.start(starts[key][task], received_heads),
                                     derive_seed(ctx.seed, task)) for task in tasks])
        return plans

    def conclude(self, ctx: ClientContext, payload: Message | None, plans: list[ClientPlan],
                 results: list[PlanResult]) -> Message:
        return self.conclude_many([ctx], [payload], [plans], [results])[0]

    def conclude_many(self, ctxs: Sequence[ClientContext], payloads: Sequence[Message | None],
                      plans: Sequence[list[ClientPlan]], results: Sequence[list[PlanResult]]) -> list[Message]:
        """Every client's reply, the round's task vectors flattened together and unified in one pass per number
        of held tasks."""
        trained = [{t: self.template.trained(r.params, [t]) for t, r in zip(ctx.data, rs, strict=True)}
                   for ctx, rs in zip(ctxs, results, strict=True)]
        states = [state for client in trained for state in client.values()]
        vectors = self.space.space.flatten_many(states) - self.initial
        counts = [len(client) for client in trained]
        unified = batched_unifications(vectors, counts) if self.params.unify else None
        replies, row = [], 0
        for c, (ctx, client) in enumerate(zip(ctxs, trained, strict=True)):
            rows = dict(zip(client, vectors[row:row + counts[c]], strict=True))
            row += counts[c]
            reports = {t: r.report for t, r in zip(ctx.data, results[c], strict=True)}
            replies.append(self.message(ctx, client, reports, rows, None if unified is None else unified[c]))
        return replies

    def reply(self, ctx: ClientContext, trained: Mapping[str, Mapping[str, Tensor]],
              reports: Mapping[str, TrainReport]) -> Message:
        """Per task, its copy's vector τ (the adapters minus their initial values) and head, unified for the wire."""
        vectors = {task: self.space.space.flatten(state) - self.initial for task, state in trained.items()}
        return self.message(ctx, trained, reports, vectors, unification(vectors) if self.params.unify else None)

    def message(self, ctx: ClientContext, trained: Mapping[str, Mapping[str, Tensor]],
                reports: Mapping[str, TrainReport], vectors: Mapping[str, Tensor], unified: Unification | None
                ) -> Message:
        """The reply: the task vectors (as `unified`, or one per task for the ablation), heads, losses and counts."""
        heads, scalars = {}, {}
        for task, state in trained.items():
            heads.update({k: v for k, v in state.items() if task_of_key(k) == task})
            scalars[LOSS_PREFIX + task] = reports[task].mean_loss[task]
            scalars[SIZE_PREFIX + task] = len(ctx.data[task][1])
        if unified is None:
            return task_vectors_message(vectors, heads, scalars, unified=False)
        return unified_message(list(trained), unified, heads, scalars)


class MatuServer(ServerProgram):
    """Keeps one task vector and one head per task; per-client payloads are unifications of those. It aggregates
    where its state lies (`aggregate` runs on the host in cache-sized blocks, on a device in few large ops)."""

    supports_device = True

    def __init__(self, setup: Setup, params: MatuParams) -> None:
        super().__init__(setup, params)
        self.space = TaskVectorSpace(setup)
        self.vectors = {t: torch.zeros(self.space.space.dim) for t in setup.specs}
        self.heads = dict(self.space.heads)

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        """Each client's payload, made once per task set (clients of one task set get the same message)."""
        sets = list(dict.fromkeys(tuple(self.setup.holdings[c]) for c in clients))
        payloads = dict(zip(sets, self.payloads(sets), strict=True))
        return {c: payloads[tuple(self.setup.holdings[c])] for c in clients}

    def payload_for(self, client: int) -> Message:
        return self.payloads([tuple(self.setup.holdings[client])])[0]

    def payloads(self, sets: list[tuple[str, ...]]) -> list[Message]:
        """The payload of each task set: its tasks' vectors, unified (the sets of one size in one batched pass),
        and heads."""
        heads = [{k: v for k, v in self.heads.items() if task_of_key(k) in tasks} for tasks in sets]
        if not self.params.unify:
            return [task_vectors_message({t: self.vectors[t] for t in tasks}, head, {}, unified=False)
                    for tasks, head in zip(sets, heads, strict=True)]
        rows = torch.stack([self.vectors[t] for tasks in sets for t in tasks])
        unified = batched_unifications(rows, [len(tasks) for tasks in sets])
        return [unified_message(list(tasks), u, head, {}) for tasks, u, head in zip(sets, unified, heads, strict=True)]

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """A MaTU reply holds, for exactly the client's tasks, their counts, their heads and either the unification
        (τ_uni, one bit mask per task, a numeric rescaler per task) or, without it, one vector per task, each of
        the task-vector space's dimension."""
        tasks = list(self.setup.holdings[client])
        problem = counts_problem(client, reply, tasks)
        if problem is not None:
            return problem
        expected = array_specs({k: v for k, v in self.heads.items() if task_of_key(k) in tasks})
        vector = ((self.space.space.dim,), self.vectors[tasks[0]].dtype)
        if not self.params.unify:
            return arrays_problem(reply, {**expected, **{VECTOR_PREFIX + t: vector for t in tasks}})
        expected.update({UNIFIED: vector, **{MASK_PREFIX + t: ((self.space.space.dim,), torch.bool) for t in tasks}})
        rescalers = [reply.scalars.get(RESCALER_PREFIX + t) for t in tasks]
        if not all(isinstance(r, int | float) and not isinstance(r, bool) for r in rescalers):
            return "reply lacks a numeric rescaler for each of its tasks"
        return arrays_problem(reply, expected)

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        received = [r for r in replies.values() if r is not None]
        if not received:
            return {}
        uploads = [upload for r in received for upload in self._uploads(r)]
        p = self.params
        self.vectors.update(aggregate(uploads, rho=p.rho, eps=p.eps, kappa=p.kappa, cross_task=p.cross_task))
        head_updates = [{k: v for k, v in r.tensors().items() if task_of_key(k) is not None} for r in received]
        weights = [fedavg_weights(list(u), task_sizes(r)) for u, r in zip(head_updates, received, strict=True)]
        self.heads.update(weighted_average(head_updates, weights))
        return self._similarity_log()

    def _uploads(self, reply: Message) -> list[dict]:
        """A reply as `aggregate` takes it: one upload, or, without unification, one per task with a full mask
        and λ = 1 (so steps 1-2 reduce to agreement-masked weighted averages of the tasks' own vectors)."""
        sizes = task_sizes(reply)
        if UNIFIED not in reply.arrays:
            device = reply.tensor(VECTOR_PREFIX + next(iter(sizes))).device  # where the reply's vectors lie
            full = torch.ones(self.space.space.dim, dtype=torch.bool, device=device)
            return [{"unified": reply.tensor(VECTOR_PREFIX + t), "masks": {t: full}, "rescalers": {t: 1.0},
                     "sizes": {t: n}} for t, n in sizes.items()]
        return [{
            "unified": reply.tensor(UNIFIED),
            "masks": {t: reply.tensor(MASK_PREFIX + t) for t in sizes},
            "rescalers": {t: float(reply.scalars[RESCALER_PREFIX + t]) for t in sizes},
            "sizes": sizes,
        }]

    def _similarity_log(self) -> dict[str, float]:
        """S(t, t') between the current task vectors (eq. 5), flattened for metrics.jsonl (paper Fig. 2)."""
        tasks = list(self.vectors)
        similarity = task_similarity(torch.stack([self.vectors[t] for t in tasks])).tolist()  # one read
        return {similarity_key(a, b): similarity[i][j] for i, a in enumerate(tasks) for j, b in enumerate(tasks)}

    def evaluate(self, test: TaskData) -> Metrics:
        """Per task, two views (spec "Evaluation"): the server's, θ_p + τ^t with the task's head, under the task's
        metric names; and the clients', θ_p + λ_n^t m_n^t ⊙ τ_n (what holder n starts its next round from),
        averaged over the task's holders, under the same names prefixed with `client_`."""
        metrics = {}
        starts = self._client_starts()
        for task, (x, y) in test.items():
            heads = {k: v for k, v in self.heads.items() if k.startswith(head_prefix(task))}
            spec = self.setup.specs[task]
            metrics[task] = evaluate(self.space.model_with(self.setup, self.vectors[task], heads), spec, x, y)
            views = [evaluate(self.space.model_with(self.setup, start, heads), spec, x, y) for start in starts[task]]
            metrics[task].update({CLIENT_VIEW_PREFIX + k: sum(v[k] for v in views) / len(views) for k in views[0]})
        return metrics

    def _client_starts(self) -> dict[str, list[Tensor]]:
        """Per task, what each holder n starts from: λ_n^t m_n^t ⊙ τ_n, the reconstruction from the unified vector
        `payload_for(n)` sends (the task's own vector under `unify: false`)."""
        starts: dict[str, list[Tensor]] = {t: [] for t in self.vectors}
        for client in self.setup.holdings:
            for task, start in received_vectors(self.payload_for(client), list(self.setup.holdings[client])).items():
                starts[task].append(start)
        return starts

    def state_dict(self) -> dict[str, Tensor]:
        return {**{VECTOR_PREFIX + t: v for t, v in self.vectors.items()}, **self.heads}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.vectors = {k[len(VECTOR_PREFIX):]: v.clone() for k, v in state.items() if k.startswith(VECTOR_PREFIX)}
        self.heads = {k: v.clone() for k, v in state.items() if not k.startswith(VECTOR_PREFIX)}


register_method(
    "matu", MethodDef(MatuClient, MatuServer, family=MANY_TASK), MatuParams,
    "MaTU: unified task vectors with per-task bit masks and rescalers; one vector per task on the server",
)

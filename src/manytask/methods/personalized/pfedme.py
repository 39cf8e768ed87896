"""pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020, "Personalized Federated Learning with Moreau Envelopes"), the
SFMTL-Graph paper's personalized-FL baseline (spec: shared/specs/sfmtl_graph.md, "Baselines").

Client i minimizes the Moreau envelope F_i(w) = min_θ f_i(θ) + (λ/2)‖θ − w‖² of its loss; the minimizer θ̂_i(w)
is its personalized model and ∇F_i(w) = λ(w − θ̂_i(w)). One round (the paper's Algorithm 1):
- client: w ← the global model, θ ← w; per mini-batch, K steps θ ← θ − plr·(∇f_i(θ; batch) + λ(θ − w)) approximate
  θ̂_i(w), then w ← w − η·λ·(w − θ); w is uploaded, θ stays in client state and is what the client is evaluated on.
- server: w ← (1 − β)·w + β·(sample-weighted mean of the uploaded w), the paper's β (the SFMTL authors' code
  swaps the two weights; we do not).
One global model serves all clients (the server holds a `GlobalModel`), so models travel in role form
(`models.multitask.to_role`): one task per client, all heads of one shape. η and the number of mini-batches come
from the run's train config (lr schedule, local steps/epochs, batch size); the updates are plain gradient steps, so
its optimizer, momentum, weight decay and gradient clipping do not apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from itertools import islice
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor, nn

from manytask.client.terms import SQUARED_DISTANCE_GRADIENT, MovingParameterTerm, squared_distance
from manytask.client.trainer import TaskData, Trainer, mean_of, shuffled_batches
from manytask.devices import on_device
from manytask.errors import clipped
from manytask.execution.plan import ClientPlan, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, MethodDef, Setup
from manytask.methods.client_state import StateSchema, model_part
from manytask.methods.common.global_model import GlobalModel, GlobalModelServer, GuardParams, fedavg_weights_of
from manytask.methods.common.personal import check_shared_head, only_task, personal_model
from manytask.methods.common.template import program_template
from manytask.methods.common.wire import fit_scalars, mean_train_losses
from manytask.methods.registry import PERSONALIZED, register_method
from manytask.models.multitask import MultiTaskModel, is_buffer, to_role, to_task, trainable_state
from manytask.search_space import Space, log_range
from manytask.tasks.task import TaskSpec

NAME = "pfedme"


class PfedmeParams(GuardParams):
    """Defaults are the pFedMe paper's MNIST (non-convex DNN) settings, the closest to SFMTL-Graph's benchmarks."""
    # ranges for manytask tune: pFedMe sweeps λ over {15, 20, 30} and its personal rate
    SEARCH_SPACE: ClassVar[Space] = {"lam": log_range(1.0, 30.0), "personal_lr": log_range(0.01, 0.2)}

    inner_steps: int = Field(default=5, ge=1, description="K: gradient steps on θ per mini-batch")
    lam: float = Field(default=15.0, gt=0, description="λ: how strongly θ is tied to the local model w")
    personal_lr: float = Field(default=0.09, gt=0, description="step size of the K inner steps on θ")
    beta: float = Field(default=1.0, gt=0, description="β in w ← (1 − β)·w_prev + β·average (1: plain averaging)")


def personal_step(theta: Tensor, grad: Tensor, local: Tensor, lr: float, lam: float) -> Tensor:
    """One of the K steps approximating θ̂(w) = argmin_θ f(θ; batch) + (λ/2)‖θ − w‖² (Algorithm 1, personalized
    model): θ − lr·(∇f(θ) + λ(θ − w))."""
    return theta - lr * (grad + lam * (theta - local))


def local_update(local: Tensor, personal: Tensor, lr: float, lam: float) -> Tensor:
    """Algorithm 1's local update, a step along the envelope's gradient λ(w − θ): w − η·λ·(w − θ)."""
    return local - lr * lam * (local - personal)


def server_beta_average(
    previous: Mapping[str, Tensor], average: Mapping[str, Tensor], beta: float
) -> dict[str, Tensor]:
    """Algorithm 1's global update: w ← (1 − β)·w_prev + β·average for every parameter of `previous`."""
    return {k: (1 - beta) * previous[k] + beta * average[k] for k in previous}


def train_personalized(
    model: nn.Module, local: Mapping[str, Tensor], batches: Iterable[tuple[Tensor, Tensor]], spec: TaskSpec,
    lr: float, params: PfedmeParams,
) -> tuple[dict[str, Tensor], float]:
    """A client's pFedMe round on task `spec`: θ are the parameters of `model` named in `local` (edited in place,
    they should start at w); per batch, K `personal_step`s on θ, then a `local_update` of w.

    Returns the final w and the mean of f(θ; batch) over all inner steps, read from the device once."""
    theta = {name: p for name, p in model.named_parameters() if name in local}
    local = {k: v.clone() for k, v in local.items()}
    losses: list[Tensor] = []
    model.train()
    for x, y in batches:
        for _ in range(params.inner_steps):
            loss = spec.loss(model(x, spec.name), y)
            grads = torch.autograd.grad(loss, list(theta.values()))
            with torch.no_grad():
                for (name, p), grad in zip(theta.items(), grads, strict=True):
                    p.copy_(personal_step(p, grad, local[name], params.personal_lr, params.lam))
            losses.append(loss.detach())
        local = {k: local_update(w, theta[k].detach(), lr, params.lam) for k, w in local.items()}
    return local, mean_of(losses, len(losses))


class PfedmeClient(ClientProgram):
    """`fit` runs Algorithm 1's loop (`train_personalized`); `plan` describes the same round for an executor:
    plain SGD at the personal rate on f(θ) + (λ/2)‖θ − w‖², K steps on each mini-batch, and w moved by
    `local_update` after each mini-batch (a `MovingParameterTerm` whose operands are w)."""

    supports_device = True

    def __init__(self, setup: Setup, params: PfedmeParams) -> None:
        super().__init__(setup, params)
        self.start = setup.common_start()
        # the inner steps: plain gradient steps at the personal rate (no momentum, weight decay, clipping, schedule)
        self.inner_trainer = Trainer(setup.train.model_copy(update={
            "optimizer": "sgd", "lr": params.personal_lr, "momentum": 0.0, "weight_decay": 0.0, "grad_clip": None,
            "lr_schedule": "constant"}), setup.specs)

    template = program_template()

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan:
        assert payload is not None, "pFedMe clients always receive the global model"
        task = only_task(self.setup, ctx.client_id, NAME)
        local = to_task(payload.tensors(), task)
        start = self.template.start(local)  # θ starts at w
        params = dict(self.template.model.named_parameters())
        w = {k: start[k] for k in local if k in params}  # its parameters; its buffers follow θ's (`reply`)
        lr = self.setup.train.lr_at(ctx.round_index, self.setup.rounds)
        move = partial(local_update, lr=lr, lam=self.params.lam)
        term = MovingParameterTerm(params, w, 0.5 * self.params.lam, squared_distance, move, self.params.inner_steps,
                                   SQUARED_DISTANCE_GRADIENT)
        return ClientPlan(self.template.model, self.inner_trainer, ctx.round_index, self.setup.rounds, {},
                          dict(ctx.data), start, ctx.seed, [term], inner_steps=self.params.inner_steps)

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan, result: PlanResult
                 ) -> Message:
        task = only_task(self.setup, ctx.client_id, NAME)
        theta = self.template.trained(result.params, [task])
        sent = {} if payload is None else to_task(payload.tensors(), task)
        return self.reply(ctx, task, sent, theta, result.moved[0], result.report.mean_loss)

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        assert payload is not None, "pFedMe clients always receive the global model"
        task = only_task(self.setup, ctx.client_id, NAME)
        local = on_device(to_task(payload.tensors(), task), self.device)
        model = personal_model(self.setup, local, device=self.device)  # θ starts at w
        moved, loss = train_personalized(
            model, {k: v for k, v in local.items() if not is_buffer(k)}, self._batches(ctx.data, task, ctx.seed),
            self.setup.specs[task], self.setup.train.lr_at(ctx.round_index, self.setup.rounds), self.params,
        )
        return self.reply(ctx, task, local, trainable_state(model, [task]), moved, {task: loss})

    def reply(self, ctx: ClientContext, task: str, sent: Mapping[str, Tensor], theta: dict[str, Tensor],
              moved: dict[str, Tensor], losses: dict[str, float]) -> Message:
        """θ kept as the client's state; w uploaded: its parameters as moved, its buffers (BatchNorm statistics,
        which the envelope step does not move) those θ ended with, in the dtypes the server sent."""
        ctx.state.clear()
        ctx.state.update(theta)
        local = {**moved, **{k: v.to(sent[k].dtype) for k, v in theta.items() if is_buffer(k) and k in sent}}
        return Message.from_tensors(to_role(local, task), scalars=fit_scalars(ctx.data, losses))

    def state_schema(self) -> StateSchema:
        return StateSchema(type(self).__name__, {"own model": model_part(self.setup.build_model())})

    def _batches(self, data: TaskData, task: str, seed: int) -> Iterable[tuple[Tensor, Tensor]]:
        """The Trainer's seeded mini-batches and count, so pFedMe sees the same batches as FedAvg would."""
        x, y = data[task]
        stream = shuffled_batches(x, y, self.setup.train.batch_size, seed, task)
        return islice(stream, self.setup.trainer().num_steps(data))

    def model_for_evaluation(self, ctx: ClientContext, payload: Message | None) -> MultiTaskModel:
        """θ, or the common initial model before the client's first round."""
        task = only_task(self.setup, ctx.client_id, NAME)
        return personal_model(self.setup, to_task(self.start, task), ctx.state, device=self.device)


class PfedmeServer(GlobalModelServer[PfedmeParams]):
    """One global model w in role form (`GlobalModel`: role keys name no task, so every parameter is weighted by
    the client's sample count): FedAvg of the uploaded w, then the β step. Clients evaluate their own θ."""

    def __init__(self, setup: Setup, params: PfedmeParams) -> None:
        super().__init__(setup, params)
        check_shared_head(setup, NAME)
        self.model = GlobalModel(setup, setup.common_start(), params.guard)
        self.parts = {}

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        received = {c: r for c, r in replies.items() if r is not None}
        if not received:
            return {}
        previous = dict(self.model.state)
        self.model.average(self.model.read_updates(received, fedavg_weights_of))
        self.model.state = server_beta_average(previous, self.model.state, self.params.beta)
        self.model.changed()
        return mean_train_losses(list(received.values()))

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """The global model only: any other key is an error."""
        unknown = sorted(set(state) - set(self.model.state))
        if unknown:
            raise ValueError(f"unknown server state '{clipped(unknown[0])}' for pFedMe, which keeps its global model")
        super().load_state_dict(state)


register_method(
    NAME, MethodDef(PfedmeClient, PfedmeServer, family=PERSONALIZED), PfedmeParams,
    "pFedMe: personalized models θ via Moreau envelopes around a β-averaged global model",
)

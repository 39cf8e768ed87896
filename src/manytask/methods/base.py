"""The method contract: a `ClientProgram`, a `ServerProgram`, and what both sides know (`Setup`).

Engines move `Message`s between the two and never look inside them; programs never know which engine runs them.
A round is: server.configure_fit -> client.fit on each sampled client -> server.aggregate_fit. Evaluation is
server-side when the server holds the model(s) to evaluate (`ServerProgram.evaluate` returns metrics), otherwise
client-side: every holder of a task evaluates its own model on that task's test set and the engine averages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from manytask.client.trainer import TaskData, TrainConfig, Trainer, evaluate
from manytask.devices import CPU
from manytask.execution.plan import ClientPlan, PlanResult, Unbatchable
from manytask.messages import Message
from manytask.methods.client_state import StateSchema
from manytask.models.adapters import LoraParams, add_lora
from manytask.models.multitask import MultiTaskModel, build_model, to_role, trainable_state
from manytask.pretrain import load_backbone_weights
from manytask.registry import Params
from manytask.seeding import derive_seed
from manytask.tasks.task import TaskSpec

Metrics = dict[str, dict[str, float]]  # task -> metric -> value
P = TypeVar("P", bound=Params)


@dataclass(frozen=True)
class Setup:
    """Everything both sides of a method know before the first round (no training data)."""

    specs: dict[str, TaskSpec]
    input_shape: tuple[int, ...]
    backbone: str
    backbone_params: dict[str, Any]
    train: TrainConfig
    seed: int
    rounds: int
    holdings: dict[int, dict[str, int]]  # client -> task -> |D_n^t|; the task allocation is public
    adapter: dict[str, Any] | None = None  # LoRA settings: the backbone is frozen, only adapters + heads train
    pretrained: str | None = None  # safetensors file of pretrained backbone weights
    decoder: dict[str, Any] | None = None  # dense decoders' params (models/decoders.py DecoderParams)
    clients_per_round: int | None = None  # the clients sampled a round (privacy accounting); None: every client

    def build_model(self) -> MultiTaskModel:
        """The initial model; identical for every caller because its seeds depend only on the run seed."""
        model = build_model(
            self.backbone, self.backbone_params, self.input_shape, self.specs, derive_seed(self.seed, "model"),
            self.decoder,
        )
        if self.pretrained is not None:
            model.backbone.load_state_dict(load_backbone_weights(self.pretrained))
        if self.adapter is not None:
            add_lora(model.backbone, LoraParams(**self.adapter), derive_seed(self.seed, "adapter"))
        return model

    def trainer(self) -> Trainer:
        return Trainer(self.train, self.specs)

    def common_start(self) -> dict[str, Tensor]:
        """The one model every client starts from when one-task clients share a whole model (FedAvg with a shared
        head, pFedMe, FedU): the initial trainable parameters in role form, with the first task's initial head."""
        first = next(iter(self.specs))
        return to_role(trainable_state(self.build_model(), [first]), first)


@dataclass
class ClientContext:
    """One client's view during one call: its data, its persistent state, and a seed for this round."""

    client_id: int
    round_index: int  # 0-based
    data: TaskData  # task -> (x, y): the client's training samples
    state: dict[str, Tensor] = field(default_factory=dict)  # persists across rounds; programs edit it in place
    seed: int = 0


class ClientProgram(ABC, Generic[P]):
    supports_device = False  # True: it trains on `self.device` (models, payloads, data and state moved there)

    def __init__(self, setup: Setup, params: P) -> None:
        self.setup = setup
        self.params = params
        self.device = CPU

    def to_device(self, device: torch.device) -> None:
        """Train on `device` from now on (called before the first client, only where `supports_device`)."""
        self.device = device

    @abstractmethod
    def fit(self, ctx: ClientContext, payload: Message | None) -> Message | None:
        """Train on the client's data; return what is uploaded (None: nothing)."""

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan | list[ClientPlan]:
        """The client's round as a plan, or as a list of plans where it trains several models (one per held task:
        MaTU's), which an executor may run batched with other clients' plans (`execution: auto | vectorized`); a
        program that makes plans also defines `conclude(ctx, payload, plan, result)`, the reply `fit` would have
        sent, given the plan(s) and the result(s) in the same form (`HostClient`). Raises `Unbatchable`, before
        changing anything, where the program trains with a loop of its own (the default); the engine then calls
        `fit`."""
        raise Unbatchable(f"{type(self).__name__} trains with a loop of its own")

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan | list[ClientPlan],
                 result: PlanResult | list[PlanResult]) -> Message | None:
        """The reply `fit` would have sent, from the executor's result(s) of `plan`'s plan(s)."""
        raise TypeError(f"{type(self).__name__} makes plans but does not conclude them")

    def plan_many(self, ctxs: Sequence[ClientContext], payloads: Sequence[Message | None]
                  ) -> list[ClientPlan | list[ClientPlan]]:
        """`plan` of every client of a batched round (what an executor calls); a program may share work among
        them, such as what clients sent the same payload compute from it."""
        return [self.plan(ctx, payload) for ctx, payload in zip(ctxs, payloads, strict=True)]

    def conclude_many(self, ctxs: Sequence[ClientContext], payloads: Sequence[Message | None],
                      plans: Sequence[ClientPlan | list[ClientPlan]], results: Sequence[PlanResult | list[PlanResult]]
                      ) -> list[Message | None]:
        """`conclude` of every client of a batched round; a program may compute its replies together."""
        return [self.conclude(*client) for client in zip(ctxs, payloads, plans, results, strict=True)]

    def state_schema(self) -> StateSchema:
        """What this program keeps in a client's state (`methods/client_state.py`); nothing by default. The engine
        refuses any other key."""
        return StateSchema(type(self).__name__)

    def evaluate(self, ctx: ClientContext, payload: Message | None, test: TaskData) -> Metrics:
        """Client-side evaluation of the client's own model on the test sets of the tasks it holds."""
        model = self.model_for_evaluation(ctx, payload)
        return {task: evaluate(model, self.setup.specs[task], x, y) for task, (x, y) in test.items()}

    def model_for_evaluation(self, ctx: ClientContext, payload: Message | None) -> MultiTaskModel:
        raise TypeError(f"{type(self).__name__} does not evaluate on clients")


class ServerProgram(ABC, Generic[P]):
    # True: it aggregates wherever its state and the replies lie, so in-process the engine moves its state (all of
    # `state_dict`) to the clients' device and replies stay there; False: it gets host replies and keeps a host state
    supports_device: ClassVar[bool] = False

    def __init__(self, setup: Setup, params: P) -> None:
        self.setup = setup
        self.params = params

    @classmethod
    def total_rounds(cls, setup: Setup, params: P) -> int:
        """The engine rounds of a run: `rounds` (R, what one FL task trains) for methods that train one model;
        methods that train several models one after another (one-by-one, MAS's groups) take more."""
        return setup.rounds

    def participants(self, round_index: int, sampled: list[int]) -> list[int]:
        """The clients this round trains: the engine's sample by default. A server may ask for others (every
        client once, to collect their masks); ids must be clients of the federation."""
        return sampled

    @abstractmethod
    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        """The payload for each participant (per-client payloads are allowed)."""

    @abstractmethod
    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        """Update the server state from the replies (sorted by client id); return scalars worth logging."""

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """Why `client`'s decoded reply is not one this server can aggregate (one sentence), or None. The engine
        treats a reply with a problem as a failed client, and checks what every method's reply must satisfy
        (`engine/screening.py`) before asking. Default: nothing more."""
        return None

    def round_problems(self, replies: Mapping[int, Message]) -> dict[int, str]:
        """Replies that each pass `reply_problem` but are implausible next to the round's others (e.g. an update
        far larger than the round's median), with the reason of each; the engine treats them as failed clients.
        Default: none."""
        return {}

    def evaluate(self, test: TaskData) -> Metrics | None:
        """Server-side evaluation per task, or None to ask the clients to evaluate their own models."""
        return None

    def configure_evaluate(self, clients: list[int]) -> dict[int, Message | None]:
        """Payloads for client-side evaluation (default: nothing)."""
        return dict.fromkeys(clients)

    def state_dict(self) -> dict[str, Tensor]:
        """Everything the server must keep across a crash."""
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state but a checkpoint holds some")


@dataclass(frozen=True)
class MethodDef:
    """A registered method: its two programs, how it sees the federation, and its family (`methods.registry`:
    plug-ins wrap hosts)."""

    client: type[ClientProgram]
    server: type[ServerProgram]
    pooled: bool = False  # True: one client per task holding all its data (the centralized reference)
    same_batch: bool = False  # True: a client's tasks must label the same inputs at every step (lookahead affinity)
    family: str = "many-task"  # one of methods.registry.FAMILIES

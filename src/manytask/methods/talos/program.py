"""What every federated TaLoS method shares (shared/specs/talos_fl.md): its parameters, its phases, its model, and
the client and server programs that run the phases on the host machinery (methods/hosts/base.py, hosts/server.py).

Phases, fixed in length so both sides know them from the round alone:
1. head-only: the backbone frozen, the heads trained and averaged with FedAvg;
2. calibration (one round, every client): each client computes its TaLoS mask on its own data, from stratified
   examples, and keeps it; the server receives only per-parameter trainable fractions (the mask-location plot);
3. sparse fine-tuning: the scored backbone parameters trained with SparseSGDM under the client's mask, the heads
   and the unscored backbone (embeddings, class token, final norm) frozen; FedAvg of the full scored vector.
The lr schedule restarts in every phase. Variants override the calibration reply, the mask a client trains under,
the upload and the server's rule (talos/partitioned.py, talos/oneshot.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor, nn

from manytask.errors import ManytaskError, clipped
from manytask.execution.plan import ClientPlan, PlanResult, WorkPlan
from manytask.messages import Message
from manytask.methods.base import ClientContext, Setup
from manytask.methods.client_state import StatePart
from manytask.methods.common.phases import Phase, Phases, PhaseStep
from manytask.methods.common.template import ModelTemplate
from manytask.methods.common.wire import counts_problem, fit_scalars
from manytask.methods.hosts.base import HostClient, HostModel, HostParams, TrainedCopy
from manytask.methods.hosts.server import HostServer
from manytask.methods.talos.batched import Calibration, Settings, calibrate_many
from manytask.methods.talos.calibration import calibration_batches
from manytask.methods.talos.mask import Masks, calibrate_mask, pack_masks, scored_parameters, unpack_masks
from manytask.models.multitask import MultiTaskModel, merged_state, task_of_key
from manytask.search_space import Space, uniform
from manytask.seeding import derive_seed
from manytask.tasks.task import TaskKind

HEAD_ONLY, CALIBRATION, SPARSE = "head-only", "calibration", "sparse"
MASK_STATE = "talos/mask"  # the client's own mask, packed bits, in its state
TRAINABLE_PREFIX = "trainable/"  # calibration reply scalars and server log: fraction of a parameter left trainable
# (calibration rounds R, soft-zero factor, raw logit) of the FL paper and of the original TaLoS code
VARIANTS = {"fl": (10, 0.01, False), "original": (4, 0.1, True)}


class TalosParams(HostParams):
    # ranges for manytask tune: TaLoS's sparsity ρ*
    SEARCH_SPACE: ClassVar[Space] = {"sparsity": uniform(0.5, 0.99)}
    sparsity: float = Field(0.9, ge=0, lt=1, description="ρ*: the fraction of scored backbone entries never trained")
    head_rounds: int | None = Field(None, ge=1, description="rounds of the head-only phase (default: half the run)")
    calibration_examples: int = Field(100, ge=1, description="examples per client and task scoring its mask")
    variant: Literal["fl", "original"] = Field(
        "fl", description="fl: log p(ŷ|x), R 10, soft-zero 0.01 (the FL paper); original: raw logit, R 4, soft-zero 0.1"
    )
    calibration_rounds: int | None = Field(None, ge=1, description="R (default: the variant's)")
    soft_zero: float | None = Field(None, ge=0, lt=1, description="soft-zero factor (default: the variant's)")
    ranking: Literal["global", "per-layer"] = Field("global", description="rank over all scored entries, or per layer")
    scored: list[str] | None = Field(
        None, description="regexes of backbone parameters scored and fine-tuned (default: all but embeddings, "
        "class token and final norm)"
    )

    def calibration(self) -> tuple[int, float, bool]:
        """(R, soft-zero, raw logit) after the variant's defaults."""
        rounds, soft_zero, raw_logit = VARIANTS[self.variant]
        return (self.calibration_rounds or rounds, soft_zero if self.soft_zero is None else self.soft_zero, raw_logit)


class TalosModel(HostModel):
    """The task model with the parts TaLoS ever trains left trainable: the heads and the scored backbone entries
    (the server keeps exactly these); every other backbone parameter stays at its pretrained value."""

    params: TalosParams

    def build_model(self) -> tuple[MultiTaskModel, nn.Module]:
        model = self.setup.build_model()
        self.scored = scored_parameters(model, self.params.scored)
        keep = set(self.scored)
        for name, param in model.backbone.named_parameters(prefix="backbone"):
            param.requires_grad_(name in keep)
        return model, model

    def build_phases(self) -> Phases:
        """head-only, calibration, then the variant's last phase; a head-only length that leaves the last phase
        no round is refused."""
        rounds = self.setup.rounds
        head = self.params.head_rounds if self.params.head_rounds is not None else self.default_head_rounds(rounds)
        last = self.last_phase()
        if head < 1 or head + 2 > rounds:
            given = "" if self.params.head_rounds is None else f"head_rounds={head} with "
            raise ManytaskError(
                f"TaLoS needs head_rounds + 2 rounds at least (head-only, calibration, fine-tuning) and one head-only "
                f"round at least, so 3 rounds at the fewest; {given}rounds={rounds}."
            )
        if last.rounds is not None and head + 1 + last.rounds != rounds:
            raise ManytaskError(f"the run ends with its {last.name} round: rounds must be head_rounds + "
                                f"{1 + last.rounds} = {head + 1 + last.rounds}, not {rounds}.")
        return Phases([Phase(HEAD_ONLY, head), Phase(CALIBRATION, 1), last], rounds)

    def default_head_rounds(self, rounds: int) -> int:
        return max(1, rounds // 2)

    def last_phase(self) -> Phase:
        return Phase(SPARSE)


def check_classification(setup: Setup) -> None:
    """TaLoS samples labels from the model's predictive distribution: classification tasks only."""
    others = [f"{name} ({spec.kind.value})" for name, spec in setup.specs.items()
              if spec.kind is not TaskKind.CLASSIFICATION]
    if others:
        raise ManytaskError(f"TaLoS takes classification tasks only, not: {', '.join(others)}.")


class TalosClient(TalosModel, HostClient):
    # masks are packed, unpacked and cut into subsets on the host (numpy), label draws come from CPU generators:
    # tests/test_devices.py compares a GPU run with the CPU's (not yet run on a GPU)

    def __init__(self, setup: Setup, params: TalosParams) -> None:
        super().__init__(setup, params)
        check_classification(setup)
        self.phases = self.build_phases()

    def phase(self, ctx: ClientContext) -> PhaseStep:
        return self.phases.at(ctx.round_index)

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        if self.phase(ctx).name == CALIBRATION:
            return self.calibrate(ctx, payload)
        return super().fit(ctx, payload)

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan | list[ClientPlan] | WorkPlan:
        """A training phase's round as a plan (the heads, or the scored entries under the client's mask); the
        calibration round's as a `WorkPlan` that the executor runs for a batch of clients at once."""
        if self.phase(ctx).name == CALIBRATION:
            calibration = self.calibration(ctx, payload)
            return WorkPlan(calibrate_many, calibration, calibration.bytes())
        return self.host_plan(ctx, payload)

    def calibration(self, ctx: ClientContext, payload: Message | None) -> Calibration:
        """What `calibrate` computes, on the model it was sent, from stratified examples of the client's data."""
        values = self.phase_values[False]
        rounds, soft_zero, raw_logit = self.params.calibration()
        settings = Settings(self.params.sparsity, rounds, soft_zero, self.params.ranking == "per-layer", raw_logit)
        return Calibration(
            values.model, merged_state(values.initial_values, self.received(ctx, payload)),
            calibration_batches(ctx.data, self.params.calibration_examples, ctx.seed), tuple(self.scored),
            {t: self.setup.specs[t].num_outputs for t in ctx.data}, settings, derive_seed(ctx.seed, "fisher"),
        )

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan | list[ClientPlan] | WorkPlan,
                 result: PlanResult | list[PlanResult] | Masks) -> Message:
        if isinstance(plan, WorkPlan):
            return self.calibration_reply(ctx, result)
        return super().conclude(ctx, payload, plan, result)

    def schedule(self, ctx: ClientContext) -> tuple[int, int]:
        step = self.phase(ctx)
        return step.local_round, step.length

    def heads_phase(self, ctx: ClientContext) -> bool:
        """Whether this round trains the heads (else the scored backbone entries)."""
        return self.phase(ctx).name == HEAD_ONLY

    def train_only(self, model: nn.Module, heads: bool) -> None:
        """Only one phase's part of `model` trainable: the heads, or the scored backbone entries."""
        keep = set(self.scored)
        for name, param in model.named_parameters():
            param.requires_grad_(task_of_key(name) is not None if heads else name in keep)

    def start(self, ctx: ClientContext, received: dict[str, Tensor], tasks: list[str]) -> TrainedCopy:
        copy = super().start(ctx, received, tasks)
        self.train_only(copy.model, self.heads_phase(ctx))
        return copy

    def loaded_copy(self, ctx: ClientContext, copy: TrainedCopy, trained: dict[str, Tensor]) -> TrainedCopy:
        loaded = super().loaded_copy(ctx, copy, trained)
        self.train_only(loaded.model, self.heads_phase(ctx))
        return loaded

    def split_upload(self, ctx: ClientContext, copy: TrainedCopy, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The head-only phase uploads the heads alone: the backbone and its buffers (BatchNorm's statistics) stay
        pretrained, as the server sends them in that phase."""
        if self.heads_phase(ctx):
            state = {k: v for k, v in state.items() if task_of_key(k) is not None}
        return super().split_upload(ctx, copy, state)

    @cached_property
    def phase_values(self) -> dict[bool, ModelTemplate]:
        """The template of each training phase, by whether it trains the heads (its flags say what moves)."""
        templates = {}
        for heads in (True, False):
            model, _ = self.build_on_device()
            self.train_only(model, heads)
            templates[heads] = ModelTemplate(model)
        return templates

    def plan_values(self, ctx: ClientContext) -> ModelTemplate:
        return self.phase_values[self.heads_phase(ctx)]

    def sparse_masks(self, ctx: ClientContext, copy: TrainedCopy) -> Masks | None:
        return None if self.heads_phase(ctx) else self.trainable_mask(ctx, copy)

    def state_parts(self, copies: tuple[str, ...], keys: list[str]) -> dict[str, StatePart]:
        return {"mask": StatePart.of([MASK_STATE])}

    def trainable_mask(self, ctx: ClientContext, copy: TrainedCopy) -> Masks:
        """The entries this client moves: its own calibrated mask."""
        if MASK_STATE not in ctx.state:
            raise ManytaskError(f"client {ctx.client_id} has no TaLoS mask: it missed the calibration round.")
        params = dict(copy.model.named_parameters())
        return unpack_masks(ctx.state[MASK_STATE], {name: params[name] for name in self.scored})

    def calibrate(self, ctx: ClientContext, payload: Message | None) -> Message:
        """Compute this client's mask on the model it was sent, from stratified examples of its own data."""
        model = self.start(ctx, self.received(ctx, payload), list(ctx.data)).model
        rounds, soft_zero, raw_logit = self.params.calibration()
        masks = calibrate_mask(
            model, calibration_batches(ctx.data, self.params.calibration_examples, ctx.seed), self.params.sparsity,
            rounds, soft_zero, self.params.scored, self.params.ranking == "per-layer", raw_logit,
            derive_seed(ctx.seed, "fisher"),
        )
        return self.calibration_reply(ctx, masks)

    def calibration_reply(self, ctx: ClientContext, masks: Masks) -> Message:
        """Keep the mask; tell the server only how much of each parameter it leaves trainable."""
        ctx.state[MASK_STATE] = pack_masks(masks)
        return Message(scalars={**fit_scalars(ctx.data, {}), **trainable_fractions(masks)})


def trainable_fractions(masks: Masks) -> dict[str, float]:
    return {TRAINABLE_PREFIX + name: float(mask.cpu().numpy().mean()) for name, mask in masks.items()}


def fractions_problem(reply: Message, scored: list[str]) -> str | None:
    """Why a calibration reply's trainable fractions are not one per scored parameter, each in [0, 1], or None."""
    for key, value in reply.scalars.items():
        if not key.startswith(TRAINABLE_PREFIX):
            continue
        if key[len(TRAINABLE_PREFIX):] not in scored:
            return f"reply reports a trainable fraction of '{clipped(key)}', which is not a scored parameter"
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            return f"reply's trainable fraction {clipped(value)} of '{clipped(key)}' is not in [0, 1]"
    return None


class TalosServer(TalosModel, HostServer):
    """FedAvg of what each phase trains; every client in the calibration round."""

    everyone_in: tuple[str, ...] = (CALIBRATION,)  # phases in which every client takes part

    def __init__(self, setup: Setup, params: TalosParams) -> None:
        super().__init__(setup, params)
        check_classification(setup)
        self.phases = self.build_phases()
        self.step = self.phases.at(0)

    def participants(self, round_index: int, sampled: list[int]) -> list[int]:
        return sorted(self.setup.holdings) if self.phases.at(round_index).name in self.everyone_in else sampled

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        self.step = self.phases.at(round_index)
        return super().configure_fit(round_index, clients)

    def payload_for(self, client: int) -> Message:
        """Its tasks' heads; the scored backbone too once it trains (before, clients hold it pretrained)."""
        message = super().payload_for(client)
        if self.step.name in (HEAD_ONLY, CALIBRATION):
            return Message.from_tensors({k: v for k, v in message.tensors().items() if task_of_key(k) is not None})
        return message

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """The calibration reply by `calibration_problem`; the other phases' by the host's rule."""
        if self.step.name == CALIBRATION:
            return self.calibration_problem(client, reply)
        return super().reply_problem(client, reply)

    def calibration_problem(self, client: int, reply: Message) -> str | None:
        """A calibration reply carries no arrays (the client keeps its mask) and, as scalars, the trainable fraction
        of scored parameters, each in [0, 1]."""
        if reply.arrays:
            return f"a calibration reply carries no arrays, but this one carries '{clipped(next(iter(reply.arrays)))}'"
        return counts_problem(client, reply, self.setup.holdings[client]) or fractions_problem(reply, self.scored)

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        step = self.phases.at(round_index)
        if step.name == CALIBRATION:
            log = self.aggregate_calibration({c: r for c, r in replies.items() if r is not None})
        elif step.name == HEAD_ONLY:
            log = super().aggregate_fit(round_index, replies)
        else:
            log = self.aggregate_sparse(round_index, replies)
        return {**log, "phase": float(step.index)}

    def aggregate_calibration(self, replies: Mapping[int, Message]) -> dict[str, float]:
        """The clients' mean trainable fraction per scored parameter (where the masks land)."""
        names = list(dict.fromkeys(k for reply in replies.values() for k in reply.scalars
                                   if k.startswith(TRAINABLE_PREFIX)))  # model order, as the clients sent them
        return {name: sum(float(r.scalars[name]) for r in replies.values()) / len(replies) for name in names}

    def aggregate_sparse(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        """FedAvg + TaLoS (Algorithm 1): θ ← Σ_k n_k θ_k / n over the full scored vector."""
        return super().aggregate_fit(round_index, replies)

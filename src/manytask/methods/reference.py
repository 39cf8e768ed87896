"""Local (no communication) and Centralized (per task, all data pooled: the normalizing reference).

Both train a private model per client that never leaves it; Centralized runs the same program on a federation
with one client per task holding all of that task's training data."""

from __future__ import annotations

from manytask.execution.plan import ClientPlan, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, MethodDef, ServerProgram
from manytask.methods.client_state import StateSchema, model_part
from manytask.methods.common.template import program_template
from manytask.methods.registry import REFERENCE, register_method
from manytask.models.multitask import MultiTaskModel, load_state, trainable_state


class PrivateModelClient(ClientProgram):
    """Keeps its whole model (backbone + its heads) in client state; sends nothing. Its round is a plan: the run's
    trainer on the client's data from its own model, which the executor may batch with other clients'."""

    supports_device = True

    def fit(self, ctx: ClientContext, payload: Message | None) -> None:
        model = self.restore(ctx)
        self.setup.trainer().train(model, ctx.data, ctx.seed, ctx.round_index, self.setup.rounds)
        ctx.state.clear()
        ctx.state.update(trainable_state(model, ctx.data.keys()))

    template = program_template()

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan:
        return ClientPlan(self.template.model, self.setup.trainer(), ctx.round_index, self.setup.rounds, {},
                          dict(ctx.data), self.template.start(ctx.state), ctx.seed)

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan, result: PlanResult) -> None:
        ctx.state.clear()
        ctx.state.update(self.template.trained(result.params, ctx.data))

    def state_schema(self) -> StateSchema:
        return StateSchema(type(self).__name__, {"own model": model_part(self.setup.build_model())})

    def model_for_evaluation(self, ctx: ClientContext, payload: Message | None) -> MultiTaskModel:
        return self.restore(ctx)

    def restore(self, ctx: ClientContext) -> MultiTaskModel:
        """The client's model: the shared initial model before its first round, its own weights after."""
        model = self.setup.build_model()
        if ctx.state:
            load_state(model, ctx.state)
        return model.to(self.device)


class SilentServer(ServerProgram):
    """A server that sends and keeps nothing."""

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        return dict.fromkeys(clients)

    def aggregate_fit(self, round_index: int, replies) -> dict[str, float]:
        return {}


register_method(
    "local", MethodDef(PrivateModelClient, SilentServer, family=REFERENCE),
    description="Local: every client trains its own model on its own data, no communication",
)
register_method(
    "centralized", MethodDef(PrivateModelClient, SilentServer, pooled=True, family=REFERENCE),
    description="Centralized: one model per task trained on all of the task's data (the reference)",
)
register_method(
    "individual", MethodDef(PrivateModelClient, SilentServer, pooled=True, family=REFERENCE),
    description="Individual (MaTU's normalizer): centralized per-task fine-tuning; same program as centralized",
)

"""One-by-one (the MAS paper's baseline): each task its own FL job with FedAvg, from scratch, for R rounds, one
task after another (a client runs one FL task at a time). The run takes n·R rounds; `rounds` is R."""

from __future__ import annotations

from manytask.methods.base import MethodDef, Setup
from manytask.methods.common.phases import Phase
from manytask.methods.mas.stages import Stage, StagedClient, StagedParams, StagedServer
from manytask.methods.registry import MANY_TASK, register_method


class OneByOneServer(StagedServer):
    @classmethod
    def build_phases(cls, setup: Setup, params: StagedParams) -> list[Phase]:
        return [Phase(f"task-{task}", setup.rounds) for task in setup.specs]

    def stage(self, index: int) -> Stage:
        task = self.tasks[index]
        return Stage(f"task-{task}", (task,), (task,))


register_method(
    "one-by-one", MethodDef(StagedClient, OneByOneServer, family=MANY_TASK), StagedParams,
    "One-by-one: every task its own FedAvg job from scratch, one after another",
)

"""FL + TaLoS one-shot (the paper's variant B, shared/specs/talos_fl.md): the partition variant with a single
training round in which every client trains its own subset for many local steps (the paper: about 80), then one
assembly of all the δ_k. The head-only phase takes every round but the last two (calibration, the one shot), and
the run ends with the shot."""

from __future__ import annotations

from pydantic import Field

from manytask.client.trainer import Trainer
from manytask.methods.base import ClientContext, MethodDef
from manytask.methods.common.phases import Phase
from manytask.methods.registry import SPARSE, register_method
from manytask.methods.talos.partitioned import PartitionClient, PartitionServer
from manytask.methods.talos.program import CALIBRATION, TalosModel, TalosParams

ONE_SHOT = "one-shot"


class OneShotParams(TalosParams):
    head_rounds: int | None = Field(None, ge=1, description="rounds of the head-only phase (default and at most: "
                                    "rounds − 2)")
    shot_steps: int = Field(80, ge=1, description="local steps of the one training round")


class OneShotModel(TalosModel):
    params: OneShotParams

    def default_head_rounds(self, rounds: int) -> int:
        return rounds - 2

    def last_phase(self) -> Phase:
        return Phase(ONE_SHOT, 1)


class OneShotClient(OneShotModel, PartitionClient):
    def trainer(self, ctx: ClientContext) -> Trainer:
        if self.phase(ctx).name != ONE_SHOT:
            return super().trainer(ctx)
        return Trainer(self.setup.train.model_copy(update={"local_steps": self.params.shot_steps}), self.setup.specs)


class OneShotServer(OneShotModel, PartitionServer):
    everyone_in = (CALIBRATION, ONE_SHOT)


register_method(
    "talos-oneshot", MethodDef(OneShotClient, OneShotServer, family=SPARSE), OneShotParams,
    "FL + TaLoS one-shot: the partition variant with one long local round and a single assembly",
)

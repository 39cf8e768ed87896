"""A given split trained from scratch: each group of `partition` its own FedAvg job for R rounds, one after another
(the exhaustive splits of the MAS paper's Table 1, against which MAS's own split is judged; MAS with a fixed
`partition` is the same split started from the all-in-one parameters). The run takes len(partition)·R rounds."""

from __future__ import annotations

from pydantic import Field

from manytask.methods.base import MethodDef, Setup
from manytask.methods.common.phases import Phase
from manytask.methods.mas.stages import Stage, StagedClient, StagedParams, StagedServer, partition_ids
from manytask.methods.registry import MANY_TASK, register_method


class FixedSplitParams(StagedParams):
    partition: list[list[str]] = Field(description="the groups, by task name; every task exactly once")


class FixedSplitServer(StagedServer):
    params: FixedSplitParams

    @classmethod
    def build_phases(cls, setup: Setup, params: FixedSplitParams) -> list[Phase]:
        partition_ids(setup, params.partition)
        return [Phase(f"group-{g + 1}", setup.rounds) for g in range(len(params.partition))]

    def stage(self, index: int) -> Stage:
        members = tuple(self.params.partition[index])
        return Stage(f"group-{index + 1}", members, members)


register_method(
    "fixed-split", MethodDef(StagedClient, FixedSplitServer, family=MANY_TASK), FixedSplitParams,
    "A given split of the tasks, each group trained from scratch (the exhaustive-split baselines of MAS)",
)

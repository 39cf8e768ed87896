"""TAG (Fifty et al., NeurIPS 2021, "Efficiently Identifying Task Groupings in Multi-Task Learning") federated as the
MAS paper compares it: the all-in-one model trains `affinity_rounds` rounds while clients measure the same lookahead
affinities as MAS; TAG's network selection then picks `groups` possibly overlapping groups (each task served by the
group where its affinity is highest), and each group is trained FROM SCRATCH for R rounds, one after another (a slot
the selection leaves unused, when fewer groups serve every task best, is idle). The
affinities are averaged over all the measuring rounds (TAG averages over its training). The run takes
affinity_rounds + groups·R rounds.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import Field

from manytask.errors import ManytaskError
from manytask.messages import Message
from manytask.methods.base import MethodDef, Setup
from manytask.methods.common.phases import Phase, PhaseStep
from manytask.methods.mas.grouping import best_cover
from manytask.methods.mas.stages import (
    Stage,
    StagedClient,
    StagedParams,
    StagedServer,
    affinity_log,
    check_groups,
    check_multi_task_clients,
    mean_affinity,
    split_log,
)
from manytask.methods.registry import MANY_TASK, register_method

AFFINITY, COVER = "affinity", "cover"


class TagParams(StagedParams):
    groups: int = Field(2, ge=1, description="groups chosen (they may overlap)")
    affinity_rounds: int = Field(10, ge=1, description="all-in-one rounds measuring affinities before the groups")


class TagServer(StagedServer):
    params: TagParams

    @classmethod
    def build_phases(cls, setup: Setup, params: TagParams) -> list[Phase]:
        check_groups(setup, params.groups)
        check_multi_task_clients(setup, "TAG")
        return [Phase(AFFINITY, params.affinity_rounds),
                *(Phase(f"group-{g + 1}", setup.rounds) for g in range(params.groups))]

    def stage(self, index: int) -> Stage:
        if index == 0:
            return Stage(AFFINITY, tuple(self.tasks), tuple(self.tasks))
        cover = self.parts[COVER]
        members = tuple(t for t, m in zip(self.tasks, cover["members"][index - 1].tolist(), strict=True) if m)
        serves = tuple(t for t, g in zip(self.tasks, cover["serves"].tolist(), strict=True) if g == index - 1)
        return Stage(f"group-{index}", members, serves)

    def measure_every(self, step: PhaseStep, round_index: int) -> int:
        return self.params.affinity_every if step.index == 0 and len(self.tasks) > 1 else 0

    def after_round(self, step: PhaseStep, round_index: int, replies: Mapping[int, Message]) -> dict[str, float]:
        if step.index == 1 and step.local_round == 0:
            members = self.parts[COVER]["members"]
            return {**split_log(self.tasks, self.parts[COVER]["serves"]),
                    **{f"{COVER}/{g + 1}/{t}": float(m) for g, row in enumerate(members)
                       for t, m in zip(self.tasks, row.tolist(), strict=True)}}
        scores = mean_affinity(replies, self.tasks) if step.index == 0 else None
        if scores is None:
            return {}
        kept = self.parts.get(AFFINITY) or {"sum": torch.zeros_like(scores, dtype=torch.float64),
                                            "count": torch.tensor(0)}
        self.parts[AFFINITY] = {"sum": kept["sum"] + scores.to(torch.float64), "count": kept["count"] + 1}
        return affinity_log(scores, self.tasks)

    def before_stage(self, index: int) -> None:
        if index != 1:
            return
        kept = self.parts.get(AFFINITY)
        if not kept:
            raise ManytaskError("TAG reached its groups without affinities: no client replied while measuring.")
        groups, serves = best_cover(kept["sum"] / kept["count"], self.params.groups)
        members = torch.zeros(self.params.groups, len(self.tasks), dtype=torch.bool)  # slots left unused: idle
        for g, group in enumerate(groups):
            members[g, group] = True
        self.parts[COVER] = {"members": members, "serves": torch.tensor(serves, dtype=torch.int64)}


register_method(
    "tag", MethodDef(StagedClient, TagServer, family=MANY_TASK, same_batch=True), TagParams,
    "TAG: lookahead affinities on the all-in-one model, overlapping groups trained from scratch",
)

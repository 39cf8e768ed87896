"""HOA (Standley et al., ICML 2020, "Which Tasks Should Be Learned Together in Multi-task Learning?", the
higher-order approximation) federated as the MAS paper compares it: every task trained alone and every pair trained
together (from scratch, `probe_rounds` each, one after another), the loss of a task in a larger group estimated as
the mean of its pairwise losses, the partition into `groups` groups with the least estimated total loss, and each
group trained from scratch for R rounds. The probes' losses are the clients' training losses in the probe's last
round (no test data is used to choose). The run takes (n + n(n−1)/2)·probe_rounds + groups·R rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import torch
from pydantic import Field

from manytask.errors import ManytaskError
from manytask.messages import Message
from manytask.methods.base import MethodDef, Setup
from manytask.methods.common.phases import Phase, PhaseStep
from manytask.methods.mas.grouping import best_hoa_partition
from manytask.methods.mas.stages import (
    SPLIT,
    Stage,
    StagedClient,
    StagedParams,
    StagedServer,
    check_groups,
    mean_losses,
    split_groups,
    split_log,
)
from manytask.methods.registry import MANY_TASK, register_method

PROBES = "probes"  # server part: L[i, j] = loss of task i trained with j (L[i, i]: alone); NaN until measured


class HoaParams(StagedParams):
    groups: int = Field(2, ge=1, description="groups of the final partition")
    probe_rounds: int | None = Field(None, ge=1, description="rounds of each single and pairwise probe (default: R)")


def probe_sets(n: int) -> list[tuple[int, ...]]:
    """The probes in training order: every task alone, then every pair."""
    return [(i,) for i in range(n)] + list(combinations(range(n), 2))


class HoaServer(StagedServer):
    params: HoaParams

    @classmethod
    def build_phases(cls, setup: Setup, params: HoaParams) -> list[Phase]:
        check_groups(setup, params.groups)
        names = list(setup.specs)
        probe = params.probe_rounds or setup.rounds
        return [*(Phase("probe-" + "+".join(names[i] for i in p), probe) for p in probe_sets(len(names))),
                *(Phase(f"group-{g + 1}", setup.rounds) for g in range(params.groups))]

    def probes(self) -> list[tuple[int, ...]]:
        return probe_sets(len(self.tasks))

    def stage(self, index: int) -> Stage:
        probes = self.probes()
        if index < len(probes):
            tasks = tuple(self.tasks[i] for i in probes[index])
            return Stage(self.phases.phases[index].name, tasks, tasks)
        ids = self.parts[SPLIT]["groups"].tolist()
        members = tuple(t for t, g in zip(self.tasks, ids, strict=True) if g == index - len(probes))
        return Stage(self.phases.phases[index].name, members, members)

    def after_round(self, step: PhaseStep, round_index: int, replies: Mapping[int, Message]) -> dict[str, float]:
        probes = self.probes()
        if step.index == len(probes) and step.local_round == 0:
            return split_log(self.tasks, self.parts[SPLIT]["groups"])
        if step.index >= len(probes) or step.local_round != step.length - 1:
            return {}
        members = probes[step.index]
        losses = mean_losses(replies, [self.tasks[i] for i in members])
        table = self.parts.get(PROBES, {}).get("L")
        table = torch.full((len(self.tasks),) * 2, float("nan"), dtype=torch.float64) if table is None else table
        partner = {i: next((j for j in members if j != i), i) for i in members}  # the pair's other task, or itself
        for i, j in partner.items():
            table[i, j] = losses.get(self.tasks[i], float("nan"))
        self.parts[PROBES] = {"L": table}
        return {f"probe/{self.tasks[i]}": table[i, j].item() for i, j in partner.items()}

    def before_stage(self, index: int) -> None:
        if index != len(self.probes()):
            return
        table = self.parts.get(PROBES, {}).get("L")
        if table is None or torch.isnan(table).any():
            raise ManytaskError("HOA reached its groups with probes missing: some probe's last round had no reply.")
        self.parts[SPLIT] = {"groups": split_groups(best_hoa_partition(table, self.params.groups), len(self.tasks))}


register_method(
    "hoa", MethodDef(StagedClient, HoaServer, family=MANY_TASK), HoaParams,
    "HOA: every task alone and every pair trained, higher-order loss estimate, groups trained from scratch",
)

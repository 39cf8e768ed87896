"""MAS (shared/specs/mas.md): merge the n tasks into one all-in-one model, train it R0 rounds with FedAvg while
clients measure lookahead affinities, split the tasks into `groups` groups by the best partition of the affinities
measured at `affinity_round`, then train each group's model, initialized from the all-in-one parameters, for R − R0
rounds, one group after another. The run takes R0 + groups·(R − R0) rounds; `rounds` is R.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from pydantic import Field

from manytask.errors import ManytaskError
from manytask.messages import Message
from manytask.methods.base import MethodDef, Setup
from manytask.methods.common.phases import Phase, PhaseStep
from manytask.methods.mas.grouping import best_partition
from manytask.methods.mas.stages import (
    SPLIT,
    Stage,
    StagedClient,
    StagedParams,
    StagedServer,
    affinity_log,
    check_groups,
    check_multi_task_clients,
    mean_affinity,
    partition_ids,
    split_groups,
    split_log,
)
from manytask.methods.registry import MANY_TASK, register_method

ALL_IN_ONE = "all-in-one"
AFFINITY = "affinity"  # server part: S at the affinity round
SPLIT_ROUND = "split_round"  # logged with the split: the round whose affinities decided it


class MasParams(StagedParams):
    groups: int = Field(2, ge=1, description="x: the groups the tasks are split into")
    r0: int | None = Field(None, ge=1, description="R0: all-in-one rounds before the split (default: 30 % of rounds)")
    affinity_round: int | None = Field(
        None, ge=1, description="the all-in-one round whose affinities decide the split (default: min(10, R0))"
    )
    affinity_rounds: Literal["split", "all"] = Field(
        "split", description="measure only in the affinity round, or in every all-in-one round (affinity plots)"
    )
    partition: list[list[str]] | None = Field(
        None, description="a given split by task name instead of the affinities' (its length replaces groups)"
    )

    def group_count(self) -> int:
        return self.groups if self.partition is None else len(self.partition)

    def all_in_one_rounds(self, rounds: int) -> int:
        return self.r0 if self.r0 is not None else max(1, round(0.3 * rounds))

    def split_round(self, rounds: int) -> int:
        return self.affinity_round or min(10, self.all_in_one_rounds(rounds))


def check_mas(setup: Setup, params: MasParams) -> None:
    if params.partition is not None:
        partition_ids(setup, params.partition)
    else:
        check_groups(setup, params.groups)
        check_multi_task_clients(setup, "MAS")
    r0 = params.all_in_one_rounds(setup.rounds)
    if r0 >= setup.rounds:
        raise ManytaskError(f"r0={r0} must be below rounds={setup.rounds}: the groups need rounds after the split.")
    if params.split_round(setup.rounds) > r0:
        raise ManytaskError(f"affinity_round={params.affinity_round} comes after the split (r0={r0}); choose a round "
                            f"from 1 to {r0}.")


class MasServer(StagedServer):
    params: MasParams

    @classmethod
    def build_phases(cls, setup: Setup, params: MasParams) -> list[Phase]:
        check_mas(setup, params)
        r0 = params.all_in_one_rounds(setup.rounds)
        return [Phase(ALL_IN_ONE, r0),
                *(Phase(f"group-{g + 1}", setup.rounds - r0) for g in range(params.group_count()))]

    def stage(self, index: int) -> Stage:
        if index == 0:
            return Stage(ALL_IN_ONE, tuple(self.tasks), tuple(self.tasks))
        ids = self.parts[SPLIT]["groups"]
        members = tuple(t for t, g in zip(self.tasks, ids.tolist(), strict=True) if g == index - 1)
        return Stage(f"group-{index}", members, members, start=ALL_IN_ONE)

    def measure_every(self, step: PhaseStep, round_index: int) -> int:
        measured = self.params.affinity_rounds == "all" or round_index + 1 == self.params.split_round(self.setup.rounds)
        wanted = step.index == 0 and measured and self.params.partition is None and len(self.tasks) > 1
        return self.params.affinity_every if wanted else 0

    def before_stage(self, index: int) -> None:
        """At the split: the all-in-one parameters every group starts from, and the best partition of S."""
        if index != 1:
            return
        self.parts[ALL_IN_ONE] = {k: v.clone() for k, v in self.global_state.items()}
        if self.params.partition is not None:
            self.parts[SPLIT] = {"groups": split_groups(partition_ids(self.setup, self.params.partition),
                                                        len(self.tasks))}
            return
        scores = self.parts.get(AFFINITY, {}).get("S")
        if scores is None:
            raise ManytaskError("MAS reached its split without affinities: no client replied in the affinity round.")
        groups = best_partition(scores, self.params.groups)
        self.parts[SPLIT] = {"groups": split_groups(groups, len(self.tasks))}

    def after_round(self, step: PhaseStep, round_index: int, replies: Mapping[int, Message]) -> dict[str, float]:
        log = {}
        scores = mean_affinity(replies, self.tasks) if step.index == 0 else None
        if scores is not None:
            log.update(affinity_log(scores, self.tasks))
            if round_index + 1 == self.params.split_round(self.setup.rounds):
                self.parts[AFFINITY] = {"S": scores.to(torch.float64)}
        if step.index == 1 and step.local_round == 0:
            log.update(split_log(self.tasks, self.parts[SPLIT]["groups"]))
            if self.params.partition is None:
                log[SPLIT_ROUND] = float(self.params.split_round(self.setup.rounds))
        return log


register_method(
    "mas", MethodDef(StagedClient, MasServer, family=MANY_TASK, same_batch=True), MasParams,
    "MAS: all-in-one FedAvg for R0 rounds with lookahead affinities, split into groups, each group continued",
)

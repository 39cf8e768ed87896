"""How many clients one batched computation may hold: an estimate of a batched round's memory per client, against
a budget (the config's `memory_budget_gb`, else a share of the machine's: half the free memory of a GPU, a quarter
of a CPU machine's RAM).

Per client the estimate counts its stacked parameters and buffers six times (the stack, the start, gradients,
optimizer state, clipping and the trained values handed back) and, per backbone pass, every layer's output for a
batch three times (the forward value, what backward keeps, its gradient): the backbone's and the heads' of the
pass's tasks (a dense task's decoder works at the input's resolution, often more than the encoder). It is an
estimate made before training, from one forward pass of the template on one sample; it errs high rather than
low."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import nn

from manytask.client.trainer import shares_inputs
from manytask.execution.plan import ClientPlan, Unbatchable, WorkPlan

PARAMETER_COPIES = 6
ACTIVATION_COPIES = 3


def default_budget(device: torch.device) -> int:
    """Bytes a batched computation may take: half the free memory of a GPU, a quarter of a CPU machine's RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): assume a 16 GB machine
        ram = 16 * 2**30
    return ram // 4


@lru_cache(maxsize=64)
def activation_bytes(model: nn.Module, tasks: tuple[str, ...], sample_shape: tuple[int, ...], dtype: torch.dtype
                      ) -> int:
    """Bytes of every leaf module's output for one sample through `model`'s backbone and `tasks`' heads (the
    backbone alone for a model without `forward_many`)."""
    total = [0]

    def count(_module: nn.Module, _inputs: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            total[0] += output[0].numel() * output.element_size()

    probe = _meta_copy(model).eval()  # shapes without data: no kernel runs, nothing is allocated
    for leaf in (m for m in probe.modules() if not list(m.children())):
        leaf.register_forward_hook(count)
    many = getattr(probe, "forward_many", None)
    x = torch.zeros(2, *sample_shape, dtype=dtype, device="meta")
    with torch.no_grad():
        many(x, list(tasks)) if many is not None else probe.backbone(x)
    return total[0]  # the hooks saw a batch of 2 and counted one sample's output each


def _meta_copy(model: nn.Module) -> nn.Module:
    """`model` with every parameter and buffer on the meta device, made without copying their data."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def client_bytes(plan: ClientPlan) -> int:
    """The estimated bytes of one client in a batched round."""
    parameters = sum(t.numel() * t.element_size() for t in plan.start.values())
    x = next(iter(plan.data.values()))[0]
    passes = [tuple(plan.data)] if shares_inputs(plan.data) else [(task,) for task in plan.data]
    batch = plan.trainer.config.batch_size
    activations = sum(activation_bytes(plan.template, tasks, tuple(x.shape[1:]), x.dtype) for tasks in passes)
    return PARAMETER_COPIES * parameters + ACTIVATION_COPIES * batch * activations


def batches(plans: Sequence[ClientPlan | WorkPlan], budget: int) -> list[list[int]]:
    """The plans' indices in consecutive batches whose estimated memory stays within `budget` bytes; `Unbatchable`
    when one client alone is over it."""
    groups: list[list[int]] = [[]]
    used = 0
    for index, plan in enumerate(plans):
        need = plan.bytes if isinstance(plan, WorkPlan) else client_bytes(plan)
        if need > budget:
            raise Unbatchable(f"one client of a batched round needs about {need / 2**30:.1f} GB, over the memory "
                              f"budget of {budget / 2**30:.1f} GB")
        if used + need > budget and groups[-1]:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += need
    return groups

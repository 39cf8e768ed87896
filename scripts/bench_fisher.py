"""Time TaLoS's Fisher scores for one client's calibration set: vectorized per-example gradients (`torch.func`)
against a per-example autograd loop, side by side on one small ViT, and check they agree.

    .venv/bin/python scripts/bench_fisher.py --examples 100 --repeats 3

Prints the seconds of each (best of the repeats, alternating so machine noise hits both) and their ratio."""

from __future__ import annotations

import argparse
import time

import torch

from manytask.methods.talos import fisher_diagonal, scored_parameters
from manytask.methods.talos.mask import sample_labels
from manytask.models.multitask import build_model
from manytask.tasks.task import TaskKind, TaskSpec

VIT = {"image_size": 32, "patch_size": 4, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
       "intermediate_size": 128}


def loop_fisher(model, task: str, x: torch.Tensor, y: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    model.eval()
    params = dict(model.named_parameters())
    totals = {n: torch.zeros_like(params[n]) for n in names}
    for i in range(len(x)):
        model.zero_grad()
        torch.log_softmax(model(x[i : i + 1], task), dim=1)[0, y[i]].backward()
        for n in names:
            totals[n] += params[n].grad.pow(2)
    return {n: t / len(x) for n, t in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = TaskSpec("cifar", TaskKind.CLASSIFICATION, 100)
    model = build_model("vit", VIT, (3, 32, 32), {"cifar": spec}, seed=0)
    names = scored_parameters(model)
    x = torch.rand(args.examples, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = sample_labels(model, "cifar", x, torch.Generator().manual_seed(1))
    fast_times, slow_times = [], []
    for _ in range(args.repeats):
        began = time.perf_counter()
        fast = fisher_diagonal(model, [("cifar", x)], names, torch.Generator().manual_seed(1))
        fast_times.append(time.perf_counter() - began)
        began = time.perf_counter()
        slow = loop_fisher(model, "cifar", x, y, names)
        slow_times.append(time.perf_counter() - began)
    worst = max(float(((fast[n] - slow[n]).abs() / slow[n].abs().clamp_min(1e-12)).max()) for n in names)
    scored = sum(p.numel() for n, p in model.named_parameters() if n in names)
    print(f"{args.examples} examples, {scored} scored parameters ({len(names)} tensors)")
    print(f"vectorized: {min(fast_times):.3f} s   per-example loop: {min(slow_times):.3f} s   "
          f"loop / vectorized: {min(slow_times) / min(fast_times):.2f}x   largest relative difference: {worst:.1e}")


if __name__ == "__main__":
    main()

"""MaTU's server round (spec steps 1-6, paper eqs. 3-7) over the clients' uploads, executed in cache-sized blocks of
columns with tasks batched: `aggregate`. The equations it composes are the pure functions of `matu_math.py`; the
blocked execution gives their results bit for bit (the notes above `_Plan` say why).

Authority: ``specs/matu.md``; source paper "Many-Task Federated Fine-Tuning via Unified Task Vectors" (Tsouvalas et
al., MaTU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from manytask.methods.manytask.matu_math import (
    DEFAULT_EPS,
    DEFAULT_KAPPA,
    DEFAULT_RHO,
    agreement64,
    check_cross_task,
    masked_weighted_sum,
    neighbours,
    similarity_from_counts,
    size_weights,
    soft_mask,
)


def aggregate(
    uploads: Sequence[Mapping[str, Any]],
    rho: float = DEFAULT_RHO,
    eps: float = DEFAULT_EPS,
    kappa: int | None = DEFAULT_KAPPA,
    cross_task: str = "mean",
) -> dict[str, Tensor]:
    """One MaTU server round, spec steps 1-6 (paper eqs. 3-7), over the clients' uploads.

    Each upload is a mapping with ``unified`` (Tensor ``[d]``, the client's τ_n), ``masks`` ({task: bool ``[d]``},
    m_n^t), ``rescalers`` ({task: float}, λ_n^t) and ``sizes`` ({task: int}, |D_n^t|); the three dicts must name the
    same tasks (the tasks the client holds). For every task t with holders N^t among the uploads:

    1. α^t = |mean_n sgn(m_n^t ⊙ τ_n)|, m̂^t = 1 where α ≥ ρ else α (:func:`agreement_mask`);
    2. τ̂^t = m̂^t ⊙ Σ_n γ_n^t λ_n^t (m_n^t ⊙ τ_n), γ from sizes (:func:`same_task_aggregate`);
    3. S = :func:`task_similarity` over the τ̂ of the tasks aggregated this round;
    4. Z^t = top-κ t' ≠ t with S(t,t') > ε (:func:`neighbours`; ties: higher S, then task-name order);
    5. τ̃^t = Σ_{t'∈Z^t} S(t,t') · m̂^t ⊙ τ̂^{t'} (:func:`cross_task_term`);
    6. combine per ``cross_task`` ∈ {"mean", "sum", "none", "uniform"} (:func:`combine`); "uniform" uses every other
       task aggregated this round with weight 1 and divides by 1 + (T − 1).

    Returns {task: float32 ``[d]``} for exactly the tasks that had at least one holder in ``uploads``, in task-name
    order. A task with no holder this round is simply absent: the caller keeps its previous vector (spec step 7).
    No uploads → ``{}``. Raises ValueError on an unknown ``cross_task`` or inconsistent shapes / keys.
    """
    check_cross_task(cross_task)
    if kappa is not None and (isinstance(kappa, bool) or not isinstance(kappa, int) or kappa < 0):
        raise ValueError(f"kappa must be a non-negative int or None, got {kappa!r}")

    # Gather, per task, its holders n ∈ N^t (upload index, mask m_n^t, λ_n^t, |D_n^t|), validated.
    vectors: list[Tensor] = []
    per_task: dict[str, tuple[list[int], list[Tensor], list[float], list[float]]] = {}
    d: int | None = None
    for i, upload in enumerate(uploads):
        where = f"upload {i}"
        missing = [k for k in ("unified", "masks", "rescalers", "sizes") if k not in upload]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unified = upload["unified"]
        if not isinstance(unified, Tensor) or unified.dim() != 1 or not unified.is_floating_point():
            shape = tuple(unified.shape) if isinstance(unified, Tensor) else type(unified).__name__
            raise ValueError(f"{where}: unified must be a 1-D float Tensor [d], got {shape}")
        if d is None:
            d = unified.shape[0]
        elif unified.shape[0] != d:
            raise ValueError(f"{where}: unified has d={unified.shape[0]}, earlier uploads have d={d}")
        masks, rescalers, sizes = upload["masks"], upload["rescalers"], upload["sizes"]
        if set(masks) != set(rescalers) or set(masks) != set(sizes):
            raise ValueError(
                f"{where}: masks, rescalers and sizes must name the same tasks, got "
                f"{sorted(masks)}, {sorted(rescalers)}, {sorted(sizes)}"
            )
        vectors.append(unified.detach())
        for task in masks:
            m = _bool_mask(masks[task], d, f"{where}, task {task!r}")
            holders, task_masks, lams, ns = per_task.setdefault(task, ([], [], [], []))
            holders.append(i)
            task_masks.append(m)
            lams.append(float(rescalers[task]))
            ns.append(float(sizes[task]))

    if not per_task or d is None:
        return {}
    names = sorted(per_task)
    num_tasks = len(names)
    device = vectors[0].device  # where the replies lie: the server's device
    # A finite sum means finite entries (a NaN or ±inf entry makes the sum NaN or ±inf); an overflowing sum of finite
    # entries only sends the upload down the literal path, which gives the same numbers.
    finite = _finite_sums(vectors)

    # Steps 1-2 run on batches of tasks with the same holder count K (see _SameTaskBatch).
    same = []
    for count, tasks in _batches({t: len(per_task[task][0]) for t, task in enumerate(names)}):
        holders = [per_task[names[t]][0][k] for t in tasks for k in range(count)]
        coeff = torch.stack([  # γ_n^t λ_n^t (size_weights validates the sizes as in same_task_aggregate)
            size_weights(per_task[names[t]][3]) * torch.as_tensor(per_task[names[t]][2], dtype=torch.float64)
            for t in tasks
        ]).unsqueeze(-1)
        task_masks = [per_task[names[t]][1][k] for t in tasks for k in range(count)]
        batch_finite = all(finite[n] for n in holders)
        # One holder, coefficients of normal size and τ of at most float32 precision: γλτ cannot underflow to 0, so
        # sgn(τ̂) = sgn(γλτ + 0) = sgn(γλ)·sgn(τ) (the similarity pass then needs no float64 arithmetic).
        sign_coeff = None
        if (count == 1 and batch_finite and all(vectors[n].dtype != torch.float64 for n in holders)
                and bool(((coeff.abs() >= 2.0**-900) & (coeff.abs() < float("inf"))).all())):
            sign_coeff = torch.sign(coeff.view(-1, 1)).to(torch.float32)
        same.append(_SameTaskBatch(
            tasks, torch.tensor(tasks, device=device), count, holders, task_masks, coeff.to(device), batch_finite,
            None if sign_coeff is None else sign_coeff.to(device),
        ))
    plan = _Plan(vectors, num_tasks, rho, same)

    # Steps 3-4. S needs every τ̂ in full before neighbours can be picked, so "mean"/"sum" take two passes over the
    # columns: the first counts sign agreements (exactly, as in _similarity64), the second recomputes τ̂ block by
    # block — cheaper than holding [T, d] float64 τ̂.
    if cross_task in ("mean", "sum"):
        if d == 0:
            raise ValueError("task_vectors must have d >= 1 entries")
        sim = similarity_from_counts(plan.count_signs(d).cpu(), d)  # read once: neighbours are picked on the host
        z = neighbours(sim, eps, kappa)
        weights = [[float(sim[t, i]) for i in z[t]] for t in range(num_tasks)]
        plan.set_cross(cross_task, z, weights, [1.0 + float(sum(w)) for w in weights])  # "mean": combine's divisor
    elif cross_task == "uniform":
        others = [[i for i in range(num_tasks) if i != t] for t in range(num_tasks)]
        plan.set_cross(cross_task, others, [[1.0] * (num_tasks - 1)] * num_tasks,
                       [1.0 + float(num_tasks - 1)] * num_tasks)

    # Steps 5-6, written span by span into each task's float32 result.
    outputs = [torch.empty(d, dtype=torch.float32, device=device) for _ in names]
    for start in range(0, d, plan.span):
        plan.write_new(outputs, start, min(start + plan.span, d))
    return dict(zip(names, outputs, strict=True))


def _finite_sums(vectors: list[Tensor]) -> list[bool]:
    """Whether each vector's entries sum to a finite value, in float64: for float32 entries exactly when every entry
    is finite; float64 entries whose sum overflows take the literal path, which gives the same numbers. On the host
    in numpy (no kernel); on a device there, read back once for all the vectors."""
    if vectors[0].is_cpu:
        return [bool(np.isfinite(np.sum(_numpy(v), dtype=np.float64))) for v in vectors]
    return torch.stack([v.detach().sum(dtype=torch.float64) for v in vectors]).isfinite().tolist()


def _numpy(vector: Tensor) -> np.ndarray:
    vector = vector.detach()
    if vector.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every bfloat16 value exactly
        vector = vector.float()
    return vector.numpy()


def _bool_mask(mask: Any, d: int, where: str) -> Tensor:
    if not isinstance(mask, Tensor):
        raise ValueError(f"{where}: mask must be a Tensor, got {type(mask).__name__}")
    if mask.shape != (d,):
        raise ValueError(f"{where}: mask has shape {tuple(mask.shape)}, expected [{d}] like the unified vector")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{where}: mask must be boolean (or hold only 0/1), got dtype {mask.dtype}")
    return mask != 0


# --------------------------------------------------------------------------------------------------------------------
# aggregate's blocked, batched execution
#
# aggregate walks the d columns in spans of _SPAN and, inside a span, in blocks of c columns, with every op on fewer
# than _GRAIN elements: torch runs those on the calling thread. (Thousands of small OpenMP regions stall badly when
# the cores are shared with other processes; and the step is a long chain of cheap element-wise ops, so
# cache-sized blocks matter more than threads.) Tasks are batched: G tasks with K holders each form one [G, K, c]
# stack. The results are bit for bit those of the task-by-task computation on the whole d (see the tests), because
#   * element-wise ops give the same values on any slicing;
#   * a sum over the K rows of a [.., K, c] stack adds each column in an order that depends only on K and on the
#     column's offset modulo the kernel's vector width (blocks start on multiples of 64), not on c, G or threads;
#   * sign votes are integers: summed exactly in float32 (|votes| ≤ K < 2^24), divided by K in float64 as mean() does;
#   * m ⊙ τ is formed as τ · m instead of where(m, τ, 0) when τ is finite: the two differ only in the sign of some
#     zeros, and every later step adds such terms to a sum that starts at +0 (or takes sgn / |·| of them), where ±0
#     give the same result; uploads with non-finite entries take the literal path.
# --------------------------------------------------------------------------------------------------------------------

# Ops on fewer elements than this run on the calling thread (torch's at::internal::GRAIN_SIZE).
_GRAIN = 32768
# Rows (tasks × holders, or tasks × neighbours) per batched stack.
_BATCH_ROWS = 64
# Columns per span: the uploads' slices are gathered a span at a time, and the outputs written a span at a time.
_SPAN = 16384
# Columns of sign votes per matmul in aggregate's similarity pass (a multiple of _SPAN, < 2^24).
_SIGN_COLUMNS = 1 << 18
# On a device, a span is one block (each op a kernel launch, not a cache-sized loop): as many columns as keep its
# largest stack under this many elements (64 MiB as float64 per row group of the batched steps).
_DEVICE_ELEMENTS = 1 << 23


class _SameTaskBatch(NamedTuple):
    tasks: list[int]  # G task indices (in name order)
    index: Tensor  # the same, as a tensor
    count: int  # K holders per task
    holders: list[int]  # G·K upload indices, task-major
    masks: list[Tensor]  # G·K masks m_n^t, task-major
    coeff: Tensor  # [G, K, 1] float64 γ_n^t λ_n^t
    finite: bool  # every holder's τ_n is finite
    sign_coeff: Tensor | None  # [G, 1] float32 sgn(γλ) where sgn(τ̂) = sgn(γλ)·sgn(τ) holds (see aggregate)


class _CrossBatch(NamedTuple):
    tasks: list[int]  # G task indices
    index: Tensor  # the same, as a tensor
    others: Tensor  # [G, L] neighbour indices t' (index T: a zero row, padding with weight 0)
    weights: Tensor  # [G, L, 1] float64 S(t,t') (1 for "uniform", 0 for padding)
    denominators: Tensor  # [G, 1] float64: 1 + Σ S(t,t') ("mean") or 1 + (T − 1) ("uniform")


class _Plan:
    """aggregate's batches and the per-span work."""

    def __init__(self, vectors: list[Tensor], num_tasks: int, rho: float, same: list[_SameTaskBatch]) -> None:
        self.vectors, self.num_tasks, self.rho, self.same = vectors, num_tasks, rho, same
        self.device = vectors[0].device
        rows = max(num_tasks + 1, *(len(b.holders) for b in same))
        # columns per span, and per block inside a span (a span is one block on a device)
        self.span = _SPAN if self.device.type == "cpu" else _device_span(rows)
        self.block = _block_size(rows) if self.device.type == "cpu" else self.span
        self.all_at_once = len(same) == 1 and same[0].tasks == list(range(num_tasks))
        self.cross_task = "none"
        self.cross: list[_CrossBatch] = []

    def set_cross(self, cross_task: str, others: list[list[int]], weights: list[list[float]],
                  denominators: list[float]) -> None:
        """Steps 5-6 for each task t: its neighbours t', their weights and the divisor. Tasks are batched by
        neighbour count L; when every L is below 16 (where the row sum is plain left-to-right) they are padded to one
        L with weight-0 terms on a zero row, which add +0 to sums that are never -0, i.e. change nothing."""
        self.cross_task = cross_task
        longest = max(len(z) for z in others)
        if longest < 16:
            pad = [(z + [self.num_tasks] * (longest - len(z)), w + [0.0] * (longest - len(w)))
                   for z, w in zip(others, weights, strict=True)]
            groups = [(longest, list(range(self.num_tasks)))]
            others, weights = [z for z, _ in pad], [w for _, w in pad]
        else:
            groups = _batches({t: len(z) for t, z in enumerate(others)})
        device = self.device
        self.cross = [
            _CrossBatch(
                tasks, torch.tensor(tasks, device=device),
                torch.tensor([others[t] for t in tasks], dtype=torch.long, device=device).view(len(tasks), count),
                torch.tensor([weights[t] for t in tasks], dtype=torch.float64, device=device).view(
                    len(tasks), count, 1),
                torch.tensor([denominators[t] for t in tasks], dtype=torch.float64, device=device).view(-1, 1),
            )
            for count, tasks in groups
        ]
        if device.type == "cpu":
            self.block = min(self.block, _block_size(max(len(b.tasks) * b.others.shape[1] for b in self.cross)))

    def _gather(self, start: int, stop: int) -> list[tuple[Tensor, Tensor]]:
        """Each same-task batch's τ_n and m_n^t rows on the columns [start, stop) (one copy per span)."""
        return [(torch.stack([self.vectors[n][start:stop] for n in b.holders]),
                 torch.stack([m[start:stop] for m in b.masks])) for b in self.same]

    def _signs(self, gathered: list[tuple[Tensor, Tensor]], lo: int, hi: int, out: Tensor) -> None:
        """sgn(τ̂) on the columns [lo, hi) of ``gathered`` into ``out`` ([T, c] float32)."""
        for batch, (taus, keep) in zip(self.same, gathered, strict=True):
            taus, keep = taus[:, lo:hi], keep[:, lo:hi]
            if batch.sign_coeff is not None:
                signs = torch.sign(taus * keep) * batch.sign_coeff
            else:
                signs = torch.sign(self._same_task_batch(batch, taus, keep)[1])
            if self.all_at_once:
                out.copy_(signs)
            else:
                out.index_copy_(0, batch.index, signs.to(torch.float32))

    def _same_task(self, gathered: list[tuple[Tensor, Tensor]], lo: int, hi: int, pad: bool = True,
                   ) -> tuple[Tensor, Tensor]:
        """Steps 1-2 on the columns [lo, hi) of ``gathered``: (m̂ [T, c], τ̂ [T, c]) in float64; with ``pad``, τ̂ has
        an extra last row of zeros (the padding target of _CrossBatch)."""
        if self.all_at_once:
            m_hat, tau_hat = self._same_task_batch(self.same[0], gathered[0][0][:, lo:hi], gathered[0][1][:, lo:hi])
            return m_hat, torch.cat([tau_hat, tau_hat.new_zeros(1, hi - lo)]) if pad else tau_hat
        m_hats = torch.empty(self.num_tasks, hi - lo, dtype=torch.float64, device=self.device)
        tau_hats = torch.zeros(self.num_tasks + pad, hi - lo, dtype=torch.float64, device=self.device)
        for batch, (taus, keep) in zip(self.same, gathered, strict=True):
            m_hat, tau_hat = self._same_task_batch(batch, taus[:, lo:hi], keep[:, lo:hi])
            m_hats.index_copy_(0, batch.index, m_hat)
            tau_hats.index_copy_(0, batch.index, tau_hat)
        return m_hats, tau_hats

    def _same_task_batch(self, batch: _SameTaskBatch, taus: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
        """agreement_mask and same_task_aggregate for the G tasks of ``batch`` on one block: [G, c] each."""
        shape = (len(batch.tasks), batch.count, taus.shape[1])
        if not batch.finite:  # the literal arithmetic
            rows = torch.where(keep, taus.to(torch.float64), torch.zeros((), dtype=torch.float64)).view(shape)
            m_hat = soft_mask(agreement64(rows), self.rho)
            return m_hat, masked_weighted_sum(m_hat, batch.coeff, rows)
        kept = taus * keep  # m_n^t ⊙ τ_n (see the notes above)
        if batch.count == 1:
            # α = |sgn τ| ∈ {0, 1}: m̂ = 1 where τ ≠ 0, and where τ = 0, 1 if 0 ≥ ρ else 0. The sum over the one
            # holder is 0 + γλτ = γλτ + 0, and m̂ · (γλτ + 0) is γλτ + 0 itself (m̂ = 1, or τ = 0 and it is +0).
            tau_hat = (batch.coeff.view(-1, 1) * kept).add_(0.0)
            if self.rho <= 0.0:
                return torch.ones_like(tau_hat), tau_hat
            return torch.sign(kept).to(torch.float64).abs_(), tau_hat
        votes = torch.sign(kept).to(torch.float32)  # exact ±1/0
        alpha = votes.view(shape).sum(dim=1).to(torch.float64).div_(batch.count).abs_()  # = the mean, exactly
        m_hat = torch.maximum(alpha, alpha >= self.rho)  # = soft_mask for α ∈ [0, 1]
        return m_hat, m_hat * (batch.coeff * kept.view(shape)).sum(dim=1)

    def count_signs(self, d: int) -> Tensor:
        """Σ_i sgn(τ̂^t_i) sgn(τ̂^{t'}_i) over all d columns, ``[T, T]`` float64 (exact). The signs are collected in
        a float32 buffer of up to :data:`_SIGN_COLUMNS` columns and counted with one matmul per buffer (exact: the
        sums are integers < 2^24); a matmul per block would open thousands of small BLAS thread regions."""
        counts = torch.zeros(self.num_tasks, self.num_tasks, dtype=torch.float64, device=self.device)
        width = self.span
        while width < _SIGN_COLUMNS and self.num_tasks * width * 2 <= 1 << 22:
            width *= 2
        signs = torch.empty(self.num_tasks, width, dtype=torch.float32, device=self.device)
        for first in range(0, d, width):
            last = min(first + width, d)
            for start in range(first, last, self.span):
                stop = min(start + self.span, last)
                gathered = self._gather(start, stop)
                for lo in range(0, stop - start, self.block):
                    hi = min(lo + self.block, stop - start)
                    self._signs(gathered, lo, hi, signs[:, start - first + lo : start - first + hi])
            used = signs[:, : last - first]
            counts += (used @ used.T).to(torch.float64)
        return counts

    def write_new(self, outputs: list[Tensor], start: int, stop: int) -> None:
        """Steps 1-6 on the columns [start, stop): the new float32 task vectors into ``outputs``."""
        gathered = self._gather(start, stop)
        staging = torch.empty(self.num_tasks, stop - start, dtype=torch.float32, device=self.device)
        for lo in range(0, stop - start, self.block):
            hi = min(lo + self.block, stop - start)
            m_hats, tau_hats = self._same_task(gathered, lo, hi)
            target = staging[:, lo:hi]
            if self.cross_task == "none":
                target.copy_(tau_hats[:-1])
                continue
            for batch in self.cross:
                # index_select, not tensor[index]: advanced indexing opens a thread region even on small tensors.
                full = len(batch.tasks) == self.num_tasks
                m_hat = m_hats if full else m_hats.index_select(0, batch.index)
                tau_hat = tau_hats[:-1] if full else tau_hats.index_select(0, batch.index)
                others = tau_hats.index_select(0, batch.others.flatten()).view(*batch.others.shape, hi - lo)
                new = tau_hat + masked_weighted_sum(m_hat, batch.weights, others)
                if self.cross_task != "sum":
                    new = new.div_(batch.denominators)
                if full:
                    target.copy_(new)
                else:
                    target.index_copy_(0, batch.index, new.to(torch.float32))
        for t, output in enumerate(outputs):
            output[start:stop] = staging[t]


def _batches(counts: Mapping[int, int]) -> list[tuple[int, list[int]]]:
    """Group task indices by their row count K (holders or neighbours): (K, tasks) batches of at most
    ⌊_BATCH_ROWS / K⌋ tasks (at least one), tasks in index order."""
    by_count: dict[int, list[int]] = {}
    for t in sorted(counts):
        by_count.setdefault(counts[t], []).append(t)
    step = {count: max(1, _BATCH_ROWS // max(count, 1)) for count in by_count}
    return [(count, tasks[i : i + step[count]]) for count, tasks in by_count.items()
            for i in range(0, len(tasks), step[count])]


def _device_span(rows: int) -> int:
    """Columns per span on a device: a multiple of 64 keeping a stack of ``rows`` rows under
    :data:`_DEVICE_ELEMENTS` elements."""
    return max(64, _DEVICE_ELEMENTS // rows // 64 * 64)


def _block_size(rows: int) -> int:
    """Columns per block for stacks of ``rows`` rows: the largest power of two ≤ :data:`_SPAN` keeping a stack under
    :data:`_GRAIN` elements, but at least 64 (blocks must start on multiples of the reduction kernels' vector width)."""
    block = _SPAN
    while block > 64 and rows * block >= _GRAIN:
        block //= 2
    return block

"""MaTU's math as pure tensor functions: task unification, similarity and the server's many-task aggregation.

Authority: ``specs/matu.md`` (the method with the equations the extracted paper text garbled); source paper
"Many-Task Federated Fine-Tuning via Unified Task Vectors" (Tsouvalas et al., MaTU), eqs. 2-7.

Every function here is pure: no nn.Module, no engine, no I/O, inputs are never modified in place, and the result
depends only on the arguments (no randomness). Task vectors are flat vectors of a ParamSpace (``[d]``, or ``[T, d]``
stacked). Results are float32; sums that matter (weighted averages, L1 norms) accumulate in float64, and sign votes
are counted exactly (integers).

Edge-case decisions (documented where they apply, tested in ``tests/test_matu_math.py``):

* Sign ties: σ_j = sgn(Σ_t τ^t_j) is 0 when the sum is exactly 0; then μ_j = 0, τ_uni_j = 0 and every mask is 0 at j.
* Rescaler λ^t = Σ|τ^t| / Σ|m^t ⊙ τ_uni|: 0/0 = 1 (spec), and x/0 = 1 for x > 0 as well. The denominator is 0 exactly
  when the mask m^t is empty, and then the reconstruction λ^t · m^t ⊙ τ_uni is the zero vector *whatever* λ^t is,
  so no value reconstructs better than another; 1 is the neutral, finite choice (never inf/nan, and it keeps the
  server's λ_n^t · (m_n^t ⊙ τ_n) term, which is zero there too, well defined).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

# κ — the number of neighbour tasks kept in the cross-task term (spec step 4; paper: Z^t = [{t' | S(t,t') > ε}]_{≤κ}).
# The paper does NOT state a value: κ appears only as a symbol (Fig. 1 caption, "construct clients' task vectors using
# the top-κ similar tasks"; §3.2 "we derive the set of top-κ similar tasks ... [·]_{≤κ} refer to top-κ"), while ε = 0.5
# and ρ = 0.4 are given in footnotes. Our choice, stated plainly: κ = 2. Justification: on the paper's 8-task benchmark
# the sign similarity finds "3 distinct task clusters" (§4.2 "Highly Conflicting task groups", Fig. 2), and each
# "no conflict" client group is three tasks from one cluster, i.e. a task has about two same-cluster peers; κ = 2 admits
# those peers and, together with the ε = 0.5 filter, keeps out-of-cluster tasks out. Keep it configurable.
DEFAULT_KAPPA = 2
DEFAULT_RHO = 0.4  # paper footnote 1: "ρ = 0.4 following Tenison et al. (2023)"
DEFAULT_EPS = 0.5  # paper footnote 2: "ε = 0.5 filters out low-similarity tasks"

CROSS_TASK_MODES = ("mean", "sum", "none", "uniform")

# Columns per block in task_similarity, which counts sign agreements block by block instead of converting all of [T, d]
# to float64 at once; < 2^24, so the counts are exact in float32 (:func:`_add_sign_counts`).
_BLOCK = 1 << 16


# --------------------------------------------------------------------------------------------------------------------
# Unification (client and server)
# --------------------------------------------------------------------------------------------------------------------


def _as_matrix(vectors: Tensor, what: str) -> Tensor:
    if not isinstance(vectors, Tensor):
        raise ValueError(f"{what} must be a Tensor, got {type(vectors).__name__}")
    if vectors.dim() != 2:
        raise ValueError(f"{what} must have shape [T, d], got {tuple(vectors.shape)}")
    if vectors.shape[0] == 0:
        raise ValueError(f"{what} must hold at least one vector (T >= 1)")
    if not vectors.is_floating_point():
        raise ValueError(f"{what} must be a floating-point tensor, got {vectors.dtype}")
    return vectors


def unify(vectors: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Unify task vectors ``[T, d]`` into ``(unified [d], masks bool [T, d], rescalers [T])`` (spec "Unification";
    paper eq. 2 and the mask / rescaler definitions of §3.2):

    * σ = sgn(Σ_t τ^t) (element-wise; the sum accumulates in float64, and σ_j = 0 on an exact tie Σ = 0);
    * μ_j = max{|τ^t_j| : sgn(τ^t_j) = σ_j}, 0 where no vector agrees and where σ_j = 0;
    * τ_uni = σ ⊙ μ;
    * m^t = 1[τ^t ⊙ τ_uni > 0] (so m^t_j = 0 wherever τ^t_j = 0 or σ_j = 0);
    * λ^t = Σ_j |τ^t_j| / Σ_j |m^t_j τ_uni_j|, with 0/0 = 1 and x/0 = 1 (empty mask: the reconstruction is 0 for any
      λ, see the module docstring).

    T = 1 gives unified = τ, mask = (τ ≠ 0), λ = 1. Outputs are float32 (masks bool); the input is not modified.
    """
    _as_matrix(vectors, "vectors")
    tau = vectors.detach().to(torch.float64)
    sigma = torch.sign(tau.sum(dim=0))  # [d], 0 on exact ties
    agrees = (torch.sign(tau) == sigma.unsqueeze(0)) & (sigma != 0).unsqueeze(0)  # [T, d]
    mu = torch.where(agrees, tau.abs(), torch.zeros_like(tau)).amax(dim=0)  # [d], 0 where none agrees
    unified = sigma * mu
    masks = (tau * unified.unsqueeze(0)) > 0
    numerator = tau.abs().sum(dim=1)
    denominator = torch.where(masks, unified.abs().unsqueeze(0), torch.zeros_like(tau)).sum(dim=1)
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    rescalers = torch.where(denominator > 0, numerator / safe, torch.ones_like(numerator))
    return unified.to(torch.float32), masks, rescalers.to(torch.float32)


def reconstruct(unified: Tensor, mask: Tensor, rescaler: float | Tensor) -> Tensor:
    """Task t's vector from the unified one: τ̇^t = λ^t · m^t ⊙ τ_uni (spec "Unification", last line).

    ``unified`` is ``[d]``; ``mask`` is ``[d]`` (one task) or ``[T, d]`` (all tasks at once, with ``rescaler`` a
    ``[T]`` tensor). Where the mask is non-empty the result has the sign of τ^t on the mask and the L1 norm of τ^t
    (that is what λ is for). Returns float32; inputs are not modified.
    """
    if unified.dim() != 1:
        raise ValueError(f"unified must have shape [d], got {tuple(unified.shape)}")
    if mask.shape[-1:] != unified.shape or mask.dim() not in (1, 2):
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match unified shape {tuple(unified.shape)}")
    scale = torch.as_tensor(rescaler, dtype=torch.float64)
    if mask.dim() == 2 and scale.dim() == 1:
        if scale.shape[0] != mask.shape[0]:
            raise ValueError(f"{scale.shape[0]} rescalers for {mask.shape[0]} masks")
        scale = scale.unsqueeze(-1)
    elif scale.dim() != 0:
        raise ValueError(f"rescaler must be a scalar (or [T] with a [T, d] mask), got shape {tuple(scale.shape)}")
    kept = torch.where(mask.to(torch.bool), unified.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
    return (scale * kept).to(torch.float32)


# --------------------------------------------------------------------------------------------------------------------
# Similarity (paper eq. 5)
# --------------------------------------------------------------------------------------------------------------------


def task_similarity(task_vectors: Tensor) -> Tensor:
    """Sign-agreement similarity ``[T, d] -> [T, T]`` (spec server step 3; paper eq. 5):
    S(t,t') = ½ ((1/d) Σ_i sgn(τ^t_i) · sgn(τ^{t'}_i) + 1) ∈ [0, 1].

    Symmetric. Zeros count as neither agreement nor conflict, so identical vectors give S = ½(nnz/d + 1): the diagonal
    is ≤ 1 and equals 1 only for a vector with no zero entry (an all-zero vector has S = ½ with everything). Opposite
    dense vectors give 0. The ±1/0 products are counted exactly (integers); the result is float32.
    """
    return _similarity64(task_vectors).to(torch.float32)


def _similarity64(task_vectors: Tensor) -> Tensor:
    """:func:`task_similarity` in float64 (used inside :func:`aggregate` so S(t,t') weights are not rounded).

    Computed block by block over the d columns (:data:`_BLOCK`): the sign products are integers, counted exactly in
    any order, so the result equals the one-shot ``sgn(τ) @ sgn(τ)ᵀ`` in float64 bit for bit without a [T, d] float64
    copy."""
    _as_matrix(task_vectors, "task_vectors")
    d = task_vectors.shape[1]
    if d == 0:
        raise ValueError("task_vectors must have d >= 1 entries")
    counts = torch.zeros(task_vectors.shape[0], task_vectors.shape[0], dtype=torch.float64)
    vectors = task_vectors.detach()
    for start in range(0, d, _BLOCK):
        _add_sign_counts(counts, vectors[:, start : start + _BLOCK])
    return _similarity_from_counts(counts, d)


def _add_sign_counts(counts: Tensor, block: Tensor) -> None:
    """counts += sgn(block) @ sgn(block)ᵀ for a ``[T, c]`` block, c ≤ :data:`_BLOCK`. The ±1/0 products and their sums
    are integers of magnitude ≤ c < 2^24, so the float32 matmul is exact (whatever its summation order)."""
    signs = torch.sign(block).to(torch.float32)
    counts += (signs @ signs.T).to(torch.float64)


def _similarity_from_counts(counts: Tensor, d: int) -> Tensor:
    """S = ½ (counts / d + 1) from the exact float64 sign-agreement counts Σ_i sgn(τ^t_i) sgn(τ^{t'}_i)."""
    return 0.5 * (counts / d + 1.0)


# --------------------------------------------------------------------------------------------------------------------
# Server round, steps 1-6 (paper eqs. 3, 4, 6, 7)
# --------------------------------------------------------------------------------------------------------------------


def agreement(masked_vectors: Tensor) -> Tensor:
    """Sign agreement of one task's holders (spec server step 1; paper eq. 3):
    α_j = |(1/|N^t|) Σ_n sgn(m_n^t ⊙ τ_n)_j| ∈ [0, 1], from the stacked ``[K, d]`` masked vectors m_n^t ⊙ τ_n.
    Returned as float64 (exact for the ±1/0 vote)."""
    _as_matrix(masked_vectors, "masked_vectors")
    return _agreement64(masked_vectors.detach().to(torch.float64))


def _agreement64(rows: Tensor) -> Tensor:
    """α over the holder axis (-2) of float64 ``[..., K, d]`` rows: the arithmetic of :func:`agreement`, shared with
    :func:`aggregate` (which runs it on ``[G, K, c]`` stacks of G tasks with K holders each)."""
    return torch.sign(rows).mean(dim=-2).abs()


def _soft_mask(alpha: Tensor, rho: float) -> Tensor:
    """m̂ = 1 where α ≥ ρ, else α (:func:`agreement_mask`)."""
    return torch.where(alpha >= rho, 1.0, alpha)


def agreement_mask(masked_vectors: Tensor, rho: float = DEFAULT_RHO) -> Tensor:
    """Aggregated soft mask m̂^t (spec server step 1; paper eq. 3): m̂_j = 1 if α_j ≥ ρ else α_j.

    ``masked_vectors`` is ``[K, d]``, one row m_n^t ⊙ τ_n per holder n ∈ N^t. Note α = k/K is compared to ρ in float64,
    so e.g. α = 2/5 meets ρ = 0.4 exactly. Returns float64 ``[d]`` (it feeds further sums)."""
    return _soft_mask(agreement(masked_vectors), rho)


def size_weights(sizes: Sequence[float] | Tensor) -> Tensor:
    """γ_n^t = |D_n^t| / Σ_{n'} |D_{n'}^t| (spec server step 2; paper eq. 4), float64 ``[K]``.

    Sizes must be ≥ 0. **[decision]** if they are all 0 the holders are weighted equally (1/K) rather than 0/0."""
    w = torch.as_tensor(sizes, dtype=torch.float64).reshape(-1)
    if w.numel() == 0:
        raise ValueError("size_weights needs at least one size")
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError(f"dataset sizes must be finite and >= 0, got {w.tolist()}")
    total = w.sum()
    if total == 0:
        return torch.full_like(w, 1.0 / w.numel())
    return w / total


def same_task_aggregate(
    masked_vectors: Tensor, rescalers: Sequence[float] | Tensor, sizes: Sequence[float] | Tensor, m_hat: Tensor
) -> Tensor:
    """Same-task aggregate (spec server step 2; paper eq. 4): τ̂^t = m̂^t ⊙ Σ_n γ_n^t · λ_n^t · (m_n^t ⊙ τ_n).

    ``masked_vectors`` ``[K, d]`` (rows m_n^t ⊙ τ_n), ``rescalers`` ``[K]`` (λ_n^t), ``sizes`` ``[K]`` (|D_n^t|, turned
    into γ by :func:`size_weights`), ``m_hat`` ``[d]`` from :func:`agreement_mask`. Accumulates and returns float64."""
    _as_matrix(masked_vectors, "masked_vectors")
    k, d = masked_vectors.shape
    lam = torch.as_tensor(rescalers, dtype=torch.float64).reshape(-1)
    gamma = size_weights(sizes)
    if lam.numel() != k or gamma.numel() != k:
        raise ValueError(f"{k} masked vectors but {lam.numel()} rescalers and {gamma.numel()} sizes")
    if m_hat.shape != (d,):
        raise ValueError(f"m_hat must have shape [{d}], got {tuple(m_hat.shape)}")
    return _masked_weighted_sum(m_hat, (gamma * lam).unsqueeze(-1), masked_vectors.detach().to(torch.float64))


def _masked_weighted_sum(mask: Tensor, coeff: Tensor, rows: Tensor) -> Tensor:
    """mask ⊙ Σ_k coeff_k · rows_k in float64 over the row axis (-2): ``coeff`` ``[..., K, 1]``, ``rows`` float64
    ``[..., K, d]``, ``mask`` ``[..., d]``. The arithmetic of eq. 4 (:func:`same_task_aggregate`) and eq. 6
    (:func:`cross_task_term`), shared with :func:`aggregate` (which batches tasks on the leading axis)."""
    return mask.to(torch.float64) * (coeff * rows).sum(dim=-2)


def neighbours(similarity: Tensor, eps: float = DEFAULT_EPS, kappa: int | None = DEFAULT_KAPPA) -> list[list[int]]:
    """Neighbour sets Z^t (spec server step 4; paper §3.2 below eq. 5): the top-κ tasks t' ≠ t with S(t,t') > ε.

    ``similarity`` is ``[T, T]``; returns, for each row t, the neighbour indices best first. Ties are broken
    deterministically: higher S first, then lower index (:func:`aggregate` orders tasks by name, so there the
    tie-break is task-name order). ``kappa=None`` keeps every t' above ε; ``kappa=0`` keeps none."""
    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be square [T, T], got {tuple(similarity.shape)}")
    if kappa is not None and (isinstance(kappa, bool) or not isinstance(kappa, int) or kappa < 0):
        raise ValueError(f"kappa must be a non-negative int or None, got {kappa!r}")
    rows = similarity.detach().to(torch.float64).tolist()
    out: list[list[int]] = []
    for t, row in enumerate(rows):
        candidates = sorted((i for i, s in enumerate(row) if i != t and s > eps), key=lambda i: (-row[i], i))
        out.append(candidates if kappa is None else candidates[:kappa])
    return out


def cross_task_term(m_hat: Tensor, others: Tensor, weights: Sequence[float] | Tensor) -> Tensor:
    """Cross-task term (spec server step 5; paper eq. 6): τ̃^t = Σ_{t'} w_{t'} · m̂^t ⊙ τ̂^{t'}.

    With ``others`` the ``[K, d]`` stack of the neighbours' τ̂^{t'} and ``weights`` their S(t,t') this is eq. 6;
    with weights 1 over every other task it is the "uniform" ablation. Note the mask is m̂^t, the mask of the
    *receiving* task t, not of t'. K = 0 gives the zero vector. Accumulates and returns float64 ``[d]``."""
    if m_hat.dim() != 1:
        raise ValueError(f"m_hat must have shape [d], got {tuple(m_hat.shape)}")
    d = m_hat.shape[0]
    w = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
    if others.dim() != 2 or others.shape[1] != d or others.shape[0] != w.numel():
        raise ValueError(f"others must have shape [{w.numel()}, {d}], got {tuple(others.shape)}")
    return _masked_weighted_sum(m_hat, w.unsqueeze(-1), others.detach().to(torch.float64))


def combine(tau_hat: Tensor, cross: Tensor, weight_sum: float, cross_task: str) -> Tensor:
    """New task vector from τ̂^t and the cross term (spec server step 6; paper eq. 7 and the §4.2 ablation):

    * ``"mean"`` (default, **[decision]**): (τ̂ + τ̃) / (1 + Σ_{t'∈Z^t} S(t,t')) — ``weight_sum`` is that Σ S;
    * ``"sum"`` (literal eq. 7): τ̂ + τ̃;
    * ``"none"``: τ̂ (``cross`` ignored);
    * ``"uniform"``: (τ̂ + Σ_{t'≠t} m̂^t ⊙ τ̂^{t'}) / (1 + (T−1)) — ``cross`` is that unweighted sum and
      ``weight_sum`` = T − 1.

    Returns float64 (the caller casts)."""
    _check_mode(cross_task)
    tau_hat = tau_hat.to(torch.float64)
    if cross_task == "none":
        return tau_hat.clone()
    total = tau_hat + cross.to(torch.float64)
    if cross_task == "sum":
        return total
    return total / (1.0 + float(weight_sum))


def _check_mode(cross_task: str) -> None:
    if cross_task not in CROSS_TASK_MODES:
        raise ValueError(f"unknown cross_task {cross_task!r}; expected one of {', '.join(CROSS_TASK_MODES)}")


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
    _check_mode(cross_task)
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
    # A finite sum means finite entries (a NaN or ±inf entry makes the sum NaN or ±inf); an overflowing sum of finite
    # entries only sends the upload down the literal path, which gives the same numbers.
    finite = [bool(torch.isfinite(v.sum())) for v in vectors]

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
            tasks, torch.tensor(tasks), count, holders, task_masks, coeff, batch_finite, sign_coeff,
        ))
    plan = _Plan(vectors, num_tasks, rho, same)

    # Steps 3-4. S needs every τ̂ in full before neighbours can be picked, so "mean"/"sum" take two passes over the
    # columns: the first counts sign agreements (exactly, as in _similarity64), the second recomputes τ̂ block by
    # block — cheaper than holding [T, d] float64 τ̂.
    if cross_task in ("mean", "sum"):
        if d == 0:
            raise ValueError("task_vectors must have d >= 1 entries")
        sim = _similarity_from_counts(plan.count_signs(d), d)
        z = neighbours(sim, eps, kappa)
        weights = [[float(sim[t, i]) for i in z[t]] for t in range(num_tasks)]
        plan.set_cross(cross_task, z, weights, [1.0 + float(sum(w)) for w in weights])  # "mean": combine's divisor
    elif cross_task == "uniform":
        others = [[i for i in range(num_tasks) if i != t] for t in range(num_tasks)]
        plan.set_cross(cross_task, others, [[1.0] * (num_tasks - 1)] * num_tasks,
                       [1.0 + float(num_tasks - 1)] * num_tasks)

    # Steps 5-6, written span by span into each task's float32 result.
    outputs = [torch.empty(d, dtype=torch.float32) for _ in names]
    for start in range(0, d, _SPAN):
        plan.write_new(outputs, start, min(start + _SPAN, d))
    return dict(zip(names, outputs, strict=True))


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
        self.block = _block_size(max(num_tasks + 1, *(len(b.holders) for b in same)))
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
        self.cross = [
            _CrossBatch(
                tasks, torch.tensor(tasks),
                torch.tensor([others[t] for t in tasks], dtype=torch.long).view(len(tasks), count),
                torch.tensor([weights[t] for t in tasks], dtype=torch.float64).view(len(tasks), count, 1),
                torch.tensor([denominators[t] for t in tasks], dtype=torch.float64).view(-1, 1),
            )
            for count, tasks in groups
        ]
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
        m_hats = torch.empty(self.num_tasks, hi - lo, dtype=torch.float64)
        tau_hats = torch.zeros(self.num_tasks + pad, hi - lo, dtype=torch.float64)
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
            m_hat = _soft_mask(_agreement64(rows), self.rho)
            return m_hat, _masked_weighted_sum(m_hat, batch.coeff, rows)
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
        m_hat = torch.maximum(alpha, alpha >= self.rho)  # = _soft_mask for α ∈ [0, 1]
        return m_hat, m_hat * (batch.coeff * kept.view(shape)).sum(dim=1)

    def count_signs(self, d: int) -> Tensor:
        """Σ_i sgn(τ̂^t_i) sgn(τ̂^{t'}_i) over all d columns, ``[T, T]`` float64 (exact). The signs are collected in
        a float32 buffer of up to :data:`_SIGN_COLUMNS` columns and counted with one matmul per buffer (exact: the
        sums are integers < 2^24); a matmul per block would open thousands of small BLAS thread regions."""
        counts = torch.zeros(self.num_tasks, self.num_tasks, dtype=torch.float64)
        width = _SPAN
        while width < _SIGN_COLUMNS and self.num_tasks * width * 2 <= 1 << 22:
            width *= 2
        signs = torch.empty(self.num_tasks, width, dtype=torch.float32)
        for first in range(0, d, width):
            last = min(first + width, d)
            for start in range(first, last, _SPAN):
                stop = min(start + _SPAN, last)
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
        staging = torch.empty(self.num_tasks, stop - start, dtype=torch.float32)
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
                new = tau_hat + _masked_weighted_sum(m_hat, batch.weights, others)
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


def _block_size(rows: int) -> int:
    """Columns per block for stacks of ``rows`` rows: the largest power of two ≤ :data:`_SPAN` keeping a stack under
    :data:`_GRAIN` elements, but at least 64 (blocks must start on multiples of the reduction kernels' vector width)."""
    block = _SPAN
    while block > 64 and rows * block >= _GRAIN:
        block //= 2
    return block

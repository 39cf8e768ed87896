"""MaTU's math as pure tensor functions: task unification, similarity and the steps of the server's many-task
aggregation (`matu_aggregate.aggregate` composes them into one round).

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

from collections.abc import Sequence

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
    paper eq. 2 and the mask / rescaler definitions of §3.2); a batch ``[B, T, d]`` unifies each of its B sets of
    vectors on its own, in one pass (every output gains the leading B):

    * σ = sgn(Σ_t τ^t) (element-wise; the sum accumulates in float64, and σ_j = 0 on an exact tie Σ = 0);
    * μ_j = max{|τ^t_j| : sgn(τ^t_j) = σ_j}, 0 where no vector agrees and where σ_j = 0;
    * τ_uni = σ ⊙ μ;
    * m^t = 1[τ^t ⊙ τ_uni > 0] (so m^t_j = 0 wherever τ^t_j = 0 or σ_j = 0);
    * λ^t = Σ_j |τ^t_j| / Σ_j |m^t_j τ_uni_j|, with 0/0 = 1 and x/0 = 1 (empty mask: the reconstruction is 0 for any
      λ, see the module docstring).

    T = 1 gives unified = τ, mask = (τ ≠ 0), λ = 1. Outputs are float32 (masks bool); the input is not modified.
    """
    _as_matrix(vectors if vectors.dim() != 3 else vectors[0], "vectors")
    tau = vectors.detach().to(torch.float64)
    sigma = torch.sign(tau.sum(dim=-2))  # [d], 0 on exact ties
    agrees = (torch.sign(tau) == sigma.unsqueeze(-2)) & (sigma != 0).unsqueeze(-2)  # [T, d]
    mu = torch.where(agrees, tau.abs(), torch.zeros_like(tau)).amax(dim=-2)  # [d], 0 where none agrees
    unified = sigma * mu
    masks = (tau * unified.unsqueeze(-2)) > 0
    numerator = tau.abs().sum(dim=-1)
    denominator = torch.where(masks, unified.abs().unsqueeze(-2), torch.zeros_like(tau)).sum(dim=-1)
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
    counts = torch.zeros(task_vectors.shape[0], task_vectors.shape[0], dtype=torch.float64, device=task_vectors.device)
    vectors = task_vectors.detach()
    for start in range(0, d, _BLOCK):
        _add_sign_counts(counts, vectors[:, start : start + _BLOCK])
    return similarity_from_counts(counts, d)


def _add_sign_counts(counts: Tensor, block: Tensor) -> None:
    """counts += sgn(block) @ sgn(block)ᵀ for a ``[T, c]`` block, c ≤ :data:`_BLOCK`. The ±1/0 products and their sums
    are integers of magnitude ≤ c < 2^24, so the float32 matmul is exact (whatever its summation order)."""
    signs = torch.sign(block).to(torch.float32)
    counts += (signs @ signs.T).to(torch.float64)


def similarity_from_counts(counts: Tensor, d: int) -> Tensor:
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
    return agreement64(masked_vectors.detach().to(torch.float64))


def agreement64(rows: Tensor) -> Tensor:
    """α over the holder axis (-2) of float64 ``[..., K, d]`` rows: the arithmetic of :func:`agreement`, shared with
    :func:`aggregate` (which runs it on ``[G, K, c]`` stacks of G tasks with K holders each)."""
    return torch.sign(rows).mean(dim=-2).abs()


def soft_mask(alpha: Tensor, rho: float) -> Tensor:
    """m̂ = 1 where α ≥ ρ, else α (:func:`agreement_mask`)."""
    return torch.where(alpha >= rho, 1.0, alpha)


def agreement_mask(masked_vectors: Tensor, rho: float = DEFAULT_RHO) -> Tensor:
    """Aggregated soft mask m̂^t (spec server step 1; paper eq. 3): m̂_j = 1 if α_j ≥ ρ else α_j.

    ``masked_vectors`` is ``[K, d]``, one row m_n^t ⊙ τ_n per holder n ∈ N^t. Note α = k/K is compared to ρ in float64,
    so e.g. α = 2/5 meets ρ = 0.4 exactly. Returns float64 ``[d]`` (it feeds further sums)."""
    return soft_mask(agreement(masked_vectors), rho)


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
    return masked_weighted_sum(m_hat, (gamma * lam).unsqueeze(-1), masked_vectors.detach().to(torch.float64))


def masked_weighted_sum(mask: Tensor, coeff: Tensor, rows: Tensor) -> Tensor:
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
    return masked_weighted_sum(m_hat, w.unsqueeze(-1), others.detach().to(torch.float64))


def combine(tau_hat: Tensor, cross: Tensor, weight_sum: float, cross_task: str) -> Tensor:
    """New task vector from τ̂^t and the cross term (spec server step 6; paper eq. 7 and the §4.2 ablation):

    * ``"mean"`` (default, **[decision]**): (τ̂ + τ̃) / (1 + Σ_{t'∈Z^t} S(t,t')) — ``weight_sum`` is that Σ S;
    * ``"sum"`` (literal eq. 7): τ̂ + τ̃;
    * ``"none"``: τ̂ (``cross`` ignored);
    * ``"uniform"``: (τ̂ + Σ_{t'≠t} m̂^t ⊙ τ̂^{t'}) / (1 + (T−1)) — ``cross`` is that unweighted sum and
      ``weight_sum`` = T − 1.

    Returns float64 (the caller casts)."""
    check_cross_task(cross_task)
    tau_hat = tau_hat.to(torch.float64)
    if cross_task == "none":
        return tau_hat.clone()
    total = tau_hat + cross.to(torch.float64)
    if cross_task == "sum":
        return total
    return total / (1.0 + float(weight_sum))


def check_cross_task(cross_task: str) -> None:
    if cross_task not in CROSS_TASK_MODES:
        raise ValueError(f"unknown cross_task {cross_task!r}; expected one of {', '.join(CROSS_TASK_MODES)}")

"""Matplotlib figure builders for attention maps and positional encodings (Agg backend, no display needed).

Every builder returns a ``matplotlib.figure.Figure`` made without pyplot's figure registry, so nothing
accumulates in long runs; ``utils.figures.maps.write_figures`` saves and closes them. Inputs may be
torch tensors or NumPy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from models.positional.rotary import rope_inv_freq, scaled_inv_freq  # noqa: E402
from models.positional.xpos import XposConfig, xpos_zeta  # noqa: E402
from utils.config import RopeConfig  # noqa: E402

ArrayLike = torch.Tensor | np.ndarray
SCALINGS = ("none", "linear", "ntk", "yarn")


def to_numpy(x: ArrayLike) -> np.ndarray:
    """Tensor (any device/dtype) or array -> float64 NumPy array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def _label_font(n: int) -> float:
    return 8.0 if n <= 20 else 6.0 if n <= 40 else 4.0


def attention_grid(weights: ArrayLike, q_tokens: Sequence[str], k_tokens: Sequence[str], title: str,
                   q_axis: str = "query", k_axis: str = "key") -> Figure:
    """One panel per head of ``weights [H, Tq, Tk]`` plus the head average; token-labelled axes, colour scale 0..1."""
    w = to_numpy(weights)
    n_heads, tq, tk = w.shape
    if (tq, tk) != (len(q_tokens), len(k_tokens)):
        raise ValueError(f"weights are {tq}x{tk} but got {len(q_tokens)} query and {len(k_tokens)} key labels")
    panels = [(w[h], f"head {h}") for h in range(n_heads)] + [(w.mean(0), "mean over heads")]
    rows, cols = _grid(len(panels))
    width, height = (min(6.0, max(2.8, 0.2 * n + 1.4)) for n in (tk, tq))
    fig = Figure(figsize=(cols * width + 1.0, rows * height + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for ax, (matrix, name) in zip(axes.flat, panels, strict=False):
        image = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(tk), list(k_tokens), rotation=90, fontsize=_label_font(tk))
        ax.set_yticks(range(tq), list(q_tokens), fontsize=_label_font(tq))
        ax.set_xlabel(k_axis, fontsize=8)
        ax.set_ylabel(q_axis, fontsize=8)
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(title)
    return fig


def pe_heatmap(table: ArrayLike, title: str = "positional encoding") -> Figure:
    """``table [T, D]`` as a position x dimension heatmap (symmetric colour scale)."""
    t = to_numpy(table)
    limit = float(np.abs(t).max()) or 1.0
    fig = Figure(figsize=(7.0, 5.0), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(t, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="value")
    return fig


def cosine_matrix(table: ArrayLike) -> np.ndarray:
    """``[T, D]`` -> ``[T, T]`` cosine similarity between rows (0 for an all-zero row)."""
    t = to_numpy(table)
    norms = np.linalg.norm(t, axis=1, keepdims=True)
    unit = t / np.where(norms > 0, norms, 1.0)
    return unit @ unit.T


def pe_cosine(table: ArrayLike, title: str = "cosine similarity between positions") -> Figure:
    """Cosine similarity between the rows (positions) of ``table [T, D]``, on a -1..1 scale."""
    sim = cosine_matrix(table)
    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(sim, cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
    ax.set_xlabel("position")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="cosine")
    return fig


def classical_mds(table: ArrayLike, dims: int = 2) -> np.ndarray:
    """Classical (Torgerson) MDS of the rows of ``[T, D]`` -> ``[T, dims]``.

    Eigendecomposition of B = -1/2 J D2 J (D2 squared Euclidean distances, J the centring matrix);
    coordinates = top eigenvectors times sqrt(eigenvalue) (negative eigenvalues clipped to 0).
    """
    x = to_numpy(table)
    sq = (x * x).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0)
    n = d2.shape[0]
    j = np.eye(n) - np.full((n, n), 1.0 / n)
    b = -0.5 * j @ d2 @ j
    values, vectors = np.linalg.eigh((b + b.T) / 2)
    order = np.argsort(values)[::-1][:dims]
    coords = vectors[:, order] * np.sqrt(np.clip(values[order], 0.0, None))
    if coords.shape[1] < dims:
        coords = np.pad(coords, ((0, 0), (0, dims - coords.shape[1])))
    return coords


def pe_mds(table: ArrayLike, title: str = "positions, classical MDS") -> Figure:
    """2-D classical MDS of the rows of ``table [T, D]``, points coloured by position and joined in order."""
    xy = classical_mds(table)
    n = xy.shape[0]
    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.subplots()
    ax.plot(xy[:, 0], xy[:, 1], color="0.8", linewidth=0.7, zorder=1)
    points = ax.scatter(xy[:, 0], xy[:, 1], c=np.arange(n), cmap="viridis", s=18, zorder=2)
    for i in sorted({0, n // 4, n // 2, 3 * n // 4, n - 1}):
        ax.annotate(str(i), xy[i], fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("MDS 1")
    ax.set_ylabel("MDS 2")
    ax.set_title(title)
    fig.colorbar(points, ax=ax, label="position")
    return fig


def cos_score(inv_freq: ArrayLike, distances: np.ndarray) -> np.ndarray:
    """mean_j cos(k theta_j) for each k: PE(0).PE(k) / PE(0).PE(0) for sinusoids, and the RoPE score of
    q = k = all-ones rotated k apart, normalised to 1 at k = 0."""
    theta = to_numpy(inv_freq)
    return np.cos(distances[:, None] * theta[None, :]).mean(1)


def rope_relative_bound(inv_freq: ArrayLike, distances: np.ndarray) -> np.ndarray:
    """RoFormer sec. 3.4.3: (1 / (d/2)) sum_j |S_j|, S_j = sum_{i<j} exp(i k theta_i), the long-term decay bound."""
    theta = to_numpy(inv_freq)
    partial = np.cumsum(np.exp(1j * distances[:, None] * theta[None, :]), axis=1)
    return np.abs(partial).mean(1)


def xpos_score(inv_freq: ArrayLike, zeta: ArrayLike, scale_base: float, distances: np.ndarray) -> np.ndarray:
    """mean_i zeta_i^(k/B) cos(k theta_i) for each distance k = n - m: the xPos score of q = k = all-ones, the
    query k positions after the key, normalised to 1 at k = 0 (Sun et al. 2022; ``models/positional/xpos.py``)."""
    theta, z = to_numpy(inv_freq), to_numpy(zeta)
    return (z[None, :] ** (distances[:, None] / scale_base) * np.cos(distances[:, None] * theta[None, :])).mean(1)


def decay_curves(
    max_distance: int, d_model: int | None = None, rope_dim: int | None = None, rope_base: float = 10000.0,
    sin_base: float = 10000.0, xpos_dim: int | None = None, xpos: XposConfig | None = None,
) -> Figure:
    """Dot product between positions k apart, k = 0..max_distance ("long-term decay").

    Left: sinusoidal PE(0).PE(k) at ``d_model``, the RoPE score of q = k = all-ones at ``rope_dim``/``rope_base``
    and the xPos one at ``xpos_dim`` (settings ``xpos``), all normalised to 1 at k = 0 (each is mean_j cos(k theta_j),
    xPos's weighted by zeta_j^(k/B)). Then (RoPE) the RoFormer bound, and (xPos) its scales zeta_j^(k/B).
    """
    if d_model is None and rope_dim is None and xpos_dim is None:
        raise ValueError("decay_curves needs d_model (sinusoidal), rope_dim (rotary) and/or xpos_dim (xPos)")
    k = np.arange(max_distance + 1, dtype=np.float64)
    x = xpos or XposConfig()
    panels = 1 + (rope_dim is not None) + (xpos_dim is not None)
    fig = Figure(figsize=(6.5 + 5.5 * (panels - 1), 4.5), layout="constrained")
    axes = list(fig.subplots(1, panels, squeeze=False)[0])
    ax = axes.pop(0)
    if d_model is not None:
        ax.plot(k, cos_score(rope_inv_freq(d_model, sin_base), k), label=f"sinusoidal, d={d_model}")
    if rope_dim is not None:
        ax.plot(k, cos_score(rope_inv_freq(rope_dim, rope_base), k), label=f"RoPE, dim={rope_dim}, base={rope_base:g}")
    if xpos_dim is not None:
        ax.plot(k, xpos_score(rope_inv_freq(xpos_dim, x.theta), xpos_zeta(xpos_dim, x.gamma), x.scale_base, k),
                label=f"xPos, dim={xpos_dim}, base={x.theta:g}, γ={x.gamma:g}, B={x.scale_base:g}")
    ax.axhline(0.0, color="0.6", linewidth=0.6)
    ax.set_xlabel("relative distance k")
    ax.set_ylabel("normalised dot product")
    ax.set_title("PE(0)·PE(k) / RoPE, xPos score of all-ones q, k")
    ax.legend(fontsize=8)
    if rope_dim is not None:
        ax = axes.pop(0)
        ax.plot(k, rope_relative_bound(rope_inv_freq(rope_dim, rope_base), k), color="C1")
        ax.set_xlabel("relative distance k")
        ax.set_ylabel("relative upper bound")
        ax.set_title(f"RoFormer bound (1/(d/2)) Σ|S_j|, dim={rope_dim}")
    if xpos_dim is not None:
        ax = axes.pop(0)
        zeta = to_numpy(xpos_zeta(xpos_dim, x.gamma))
        for j in sorted({0, len(zeta) // 2, len(zeta) - 1}):
            ax.plot(k, zeta[j] ** (k / x.scale_base), label=f"pair j={j}, ζ={zeta[j]:.3f}")
        ax.plot(k, (zeta[None, :] ** (k[:, None] / x.scale_base)).mean(1), color="k", linestyle="--",
                label="mean over pairs")
        ax.set_ylim(0.0, 1.05)
        ax.set_xlabel("relative distance k = n − m (query after key)")
        ax.set_ylabel("scale of pair j's score")
        ax.set_title(f"xPos decay ζ_j^(k/B), γ={x.gamma:g}, B={x.scale_base:g}")
        ax.legend(fontsize=8)
    fig.suptitle("long-term decay with distance")
    return fig


def bias_grid(bias: ArrayLike, title: str, causal: bool = False, first_q: int = 0, first_k: int = 0) -> Figure:
    """Per-head additive attention biases ``[H, Tq, Tk]`` (ALiBi, T5), each with its own colour scale.

    ``causal`` blanks keys after the query (masked in the decoder anyway).
    """
    b = to_numpy(bias).copy()
    n_heads, tq, tk = b.shape
    if causal:
        q = np.arange(first_q, first_q + tq)[:, None]
        kk = np.arange(first_k, first_k + tk)[None, :]
        b[:, np.broadcast_to(kk > q, (tq, tk))] = np.nan
    rows, cols = _grid(n_heads, 4)
    fig = Figure(figsize=(cols * 3.6, rows * 3.1 + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    extent = (first_k - 0.5, first_k + tk - 0.5, first_q + tq - 0.5, first_q - 0.5)
    for h, ax in enumerate(axes.flat):
        if h >= n_heads:
            ax.set_axis_off()
            continue
        image = ax.imshow(b[h], cmap="magma", aspect="auto", interpolation="nearest", extent=extent)
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("key position", fontsize=8)
        ax.set_ylabel("query position", fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title)
    return fig


def relative_tables(tables: dict[str, ArrayLike], max_distance: int, title: str) -> Figure:
    """Learned relative-position tables ``[2k+1, Dh]`` (Shaw's a^K, a^V): a distance x dim heatmap and the
    cosine similarity between distances -k..k, one row of panels per table."""
    fig = Figure(figsize=(11.0, 4.2 * len(tables) + 0.5), layout="constrained")
    axes = fig.subplots(len(tables), 2, squeeze=False)
    k = max_distance
    for (name, table), (left, right) in zip(tables.items(), axes, strict=True):
        t = to_numpy(table)
        limit = float(np.abs(t).max()) or 1.0
        image = left.imshow(t, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest",
                            extent=(-0.5, t.shape[1] - 0.5, k + 0.5, -k - 0.5))
        left.set_xlabel("dimension")
        left.set_ylabel("relative distance j - i (clipped)")
        left.set_title(f"{name} table")
        fig.colorbar(image, ax=left)
        image = right.imshow(cosine_matrix(t), cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest",
                             extent=(-k - 0.5, k + 0.5, k + 0.5, -k - 0.5))
        right.set_xlabel("relative distance")
        right.set_ylabel("relative distance")
        right.set_title(f"{name}: cosine between distances")
        fig.colorbar(image, ax=right)
    fig.suptitle(title)
    return fig


def augment_positions(draws: ArrayLike, title: str, examples: int = 5) -> Figure:
    """The positions a training-time augmentation gives the tokens of one stack, ``draws`` ``[draws, T]`` (one row
    per training batch): per token index i, the 5-95 % band and the median of its positions, the first
    ``examples`` draws, and the positions 0..T-1 that inference uses."""
    d = to_numpy(draws).astype(np.float64)
    i = np.arange(d.shape[1])
    low, mid, high = np.percentile(d, [5, 50, 95], axis=0)
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.fill_between(i, low, high, color="C0", alpha=0.25, label=f"5-95 % of {d.shape[0]} draws")
    ax.plot(i, mid, color="C0", label="median")
    for n, row in enumerate(d[:examples]):
        ax.plot(i, row, color="C1", linewidth=0.7, alpha=0.7, marker=".", markersize=3,
                label="single draws (one per batch)" if n == 0 else None)
    ax.plot(i, i, color="k", linestyle="--", linewidth=1.0, label="inference: 0..T−1")
    ax.set_xlabel("token index i")
    ax.set_ylabel("position given to token i in training")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def _axis_with_markers(ax: Axes, rope_cfg: RopeConfig, factor: float) -> None:
    ax.axvline(rope_cfg.original_max_len, color="0.4", linestyle="--", linewidth=0.8)
    ax.axvline(rope_cfg.original_max_len * factor, color="0.4", linestyle=":", linewidth=0.8)


def rope_scaling_curves(rope_cfg: RopeConfig, head_dim: int, length: int) -> Figure:
    """RoPE without and with each length-extension scaling (none, linear, ntk, yarn at ``rope_cfg.factor``, or 4).

    Left: the score of q = k = all-ones rotated k apart, mean_j cos(k theta'_j) times the YaRN temperature
    factor (scale^2), k = 0..length; dashed line at L = original_max_len, dotted at s * L. Right: the
    wavelength 2 pi / theta'_j of each rotated pair j.
    """
    dim = rope_cfg.dim or head_dim
    factor = rope_cfg.factor if rope_cfg.factor > 1 else 4.0
    k = np.arange(length + 1, dtype=np.float64)
    fig = Figure(figsize=(12.0, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    for name in SCALINGS:
        cfg = rope_cfg.model_copy(update=dict(scaling=name, factor=1.0 if name == "none" else factor))
        inv, scale = scaled_inv_freq(cfg, dim)
        label = name if name == "none" else f"{name} (s={factor:g})"
        if name == rope_cfg.scaling:
            label += " [configured]"
        left.plot(k, scale**2 * cos_score(inv, k), label=label, linewidth=1.0)
        right.plot(np.arange(len(inv)), 2 * math.pi / to_numpy(inv), marker=".", label=label, linewidth=1.0)
    _axis_with_markers(left, rope_cfg, factor)
    left.set_xlabel("relative distance k (dashed: L, dotted: s·L)")
    left.set_ylabel("score of all-ones q, k (normalised)")
    left.set_title(f"RoPE score vs distance, dim={dim}, base={rope_cfg.theta:g}")
    left.legend(fontsize=8)
    right.axhline(rope_cfg.original_max_len, color="0.4", linestyle="--", linewidth=0.8)
    right.set_yscale("log")
    right.set_xlabel("pair j")
    right.set_ylabel("wavelength 2π/θ_j (positions)")
    right.set_title("per-pair wavelength (dashed: L)")
    right.legend(fontsize=8)
    fig.suptitle(f"RoPE length-extension scalings (L={rope_cfg.original_max_len})")
    return fig


def alignment_figure(weights: ArrayLike, src_tokens: Sequence[str], tgt_tokens: Sequence[str], title: str) -> Figure:
    """The hard alignment read off cross-attention ``weights [Tt, Ts]`` (mean over heads): for each predicted
    target token (row) its argmax source token, drawn over the weights, with the monotone diagonal."""
    w = to_numpy(weights)
    tt, ts = w.shape
    fig = Figure(figsize=(min(9.0, 0.3 * ts + 2.5), min(9.0, 0.3 * tt + 1.8)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(w, vmin=0.0, vmax=1.0, cmap="Greys", aspect="auto", interpolation="nearest")
    best = w.argmax(axis=1)
    ax.scatter(best, range(tt), marker="s", s=40, facecolors="none", edgecolors="tab:red", label="argmax source")
    diagonal = np.arange(tt) * (ts - 1) / max(tt - 1, 1)
    ax.plot(diagonal, range(tt), color="tab:blue", linewidth=1, linestyle="--", label="monotone diagonal")
    ax.set_xticks(range(ts), list(src_tokens), rotation=90, fontsize=_label_font(ts))
    ax.set_yticks(range(tt), list(tgt_tokens), fontsize=_label_font(tt))
    ax.set_xlabel("source token")
    ax.set_ylabel("target token being predicted")
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.6, label="attention weight (mean over heads)")
    return fig

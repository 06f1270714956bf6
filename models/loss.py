"""The output layer and its cross-entropy in one pass over row chunks, never holding ``[N, V]`` logits.

A training step's largest tensors are the logits of the output layer and what the loss makes of them:
``[N, V]`` scores, their fp32 copy, the log-softmax kept for backward and its gradient, four times
N x V x 4 bytes (450 MB at 3,500 target tokens and V = 8,000). ``linear_cross_entropy`` computes
``sum_i CE(h_i W^T, y_i)`` chunk by chunk and, since the loss is the end of the graph, its gradients
with respect to ``h`` and ``W`` in the same pass (the fused linear cross-entropy of Liger Kernel and of
Wijmans et al. 2025, "Cut Your Losses in Large-Vocabulary Language Models", here in plain PyTorch for
CPU and CUDA alike): memory for one chunk of ``rows x V`` instead of four ``N x V`` tensors, no
recomputation, and no allocation large enough for malloc to ``mmap`` and fault in again every step.

With label smoothing eps (Szegedy et al. 2016, eq. as in ``torch.nn.functional.cross_entropy``), per row
with logits z, target y and lse = logsumexp(z)::

    loss  = lse - (1 - eps) z_y - eps / V * sum_c z_c
    dloss/dz = softmax(z) - (1 - eps) onehot(y) - eps / V
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 22  # logits per chunk: 16 MiB in fp32, under glibc's largest mmap threshold (32 MiB)


def chunk_rows(vocab_size: int, elements: int | None = None) -> int:
    """Rows per chunk so that a chunk's ``[rows, V]`` fp32 logits take at most ``elements`` values
    (``CHUNK_ELEMENTS`` by default), and at least 16 rows."""
    return max(16, (elements or CHUNK_ELEMENTS) // max(vocab_size, 1))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float,
                compute_dtype: torch.dtype, rows: int) -> torch.Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(compute_dtype)
        vocab = weight.shape[0]
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_h = torch.empty_like(hidden, dtype=torch.float32) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        for start in range(0, hidden.shape[0], rows):
            h = hidden[start:start + rows].to(compute_dtype)
            y = target[start:start + rows]
            z = (h @ w.t()).float()  # [r, V]
            lse = torch.logsumexp(z, dim=-1)  # [r]
            z_y = z.gather(1, y[:, None]).squeeze(1)
            loss = lse - (1.0 - label_smoothing) * z_y
            if label_smoothing:
                loss = loss - label_smoothing / vocab * z.sum(dim=-1)
            total += loss.sum()
            if need_h or need_w:
                g = z.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                g.scatter_add_(1, y[:, None], g.new_full((y.shape[0], 1), -(1.0 - label_smoothing)))
                if label_smoothing:
                    g.sub_(label_smoothing / vocab)
                g = g.to(compute_dtype)
                if need_h:
                    grad_h[start:start + rows] = g @ w
                if need_w:
                    grad_w += (g.t() @ h).float()
        ctx.save_for_backward(grad_h if need_h else None, grad_w if need_w else None)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        dh = (grad_h * grad_out).to(h_dtype) if grad_h is not None else None
        dw = (grad_w * grad_out).to(w_dtype) if grad_w is not None else None
        return dh, dw, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         label_smoothing: float = 0.0, rows: int | None = None) -> torch.Tensor:
    """Summed cross-entropy of ``hidden @ weight.T`` against ``target``, chunk by chunk.

    hidden ``[N, D]``, weight ``[V, D]`` (the output layer, bias-free), target ``[N]`` (no padding: select
    the real rows first) -> scalar fp32. Equals ``F.cross_entropy(F.linear(hidden, weight).float(), target,
    label_smoothing=..., reduction="sum")`` and its gradients. Under autocast the products run in the
    autocast dtype (bf16: as ``F.linear`` would) and the softmax in fp32.
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    with torch.autocast(device, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, target, float(label_smoothing), dtype,
                                         rows or chunk_rows(weight.shape[0]))

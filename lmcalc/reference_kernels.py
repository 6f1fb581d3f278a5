"""Stand-ins for fused kernels in the reference model: each keeps for backward what one kernel keeps, its input and a
few statistics, where PyTorch's operators would keep every intermediate. torch is imported here and nowhere in the
accounting path."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) · w, saving only x and 1/rms for backward (what fused RMSNorm kernels keep); w may be None
    (a norm without a weight)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        y = (x.float() * rstd).to(x.dtype)
        return y if weight is None else y * weight

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xhat = x.float() * rstd
        grad_weight = None if weight is None else (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        g = grad.float() if weight is None else grad.float() * weight.float()
        grad_x = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5, weight: bool = True, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype)) if weight else None
        self.eps = eps

    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight, self.eps)


class XIELUFunction(torch.autograd.Function):
    """xIELU (Huang et al. 2025, Apertus' activation), as one kernel: y = αp·x² + β·x where x > 0, else
    αn·(expm1(min(x, ε)) − x) + β·x, with αp = softplus(a_p), αn = β + softplus(a_n), β = 0.5, ε = −1e-6 (transformers'
    XIELUActivation); it keeps x and the two scalars, what ``engine.memory.ffn`` counts for an activation kernel."""

    BETA, EPS = 0.5, -1e-6
    SLICE = 1 << 16  # elements a backward slice holds its temporaries for

    @staticmethod
    def forward(ctx, x, a_p, a_n):
        ctx.save_for_backward(x, a_p, a_n)
        alpha_p, alpha_n = F.softplus(a_p), XIELUFunction.BETA + F.softplus(a_n)
        negative = (torch.expm1(torch.clamp(x, max=XIELUFunction.EPS)) - x) * alpha_n
        return torch.where(x > 0, alpha_p * x * x, negative) + XIELUFunction.BETA * x

    @staticmethod
    def backward(ctx, grad):
        """In slices of ``SLICE`` elements, so that, as in a kernel, only the input's gradient is made at full size."""
        x, a_p, a_n = ctx.saved_tensors
        alpha_p, alpha_n, beta = F.softplus(a_p), XIELUFunction.BETA + F.softplus(a_n), XIELUFunction.BETA
        flat_x, flat_grad = x.reshape(-1), grad.reshape(-1)
        grad_x = torch.empty_like(flat_x)
        grad_a_p, grad_a_n = torch.zeros_like(a_p), torch.zeros_like(a_n)
        for start in range(0, flat_x.numel(), XIELUFunction.SLICE):
            u, g = flat_x[start : start + XIELUFunction.SLICE], flat_grad[start : start + XIELUFunction.SLICE]
            positive, clamped = u > 0, torch.clamp(u, max=XIELUFunction.EPS)
            d_negative = alpha_n * (torch.where(u < XIELUFunction.EPS, torch.exp(clamped), 0.0) - 1)
            grad_x[start : start + u.numel()] = g * (torch.where(positive, 2 * alpha_p * u, d_negative) + beta)
            grad_a_p += (g * torch.where(positive, u * u, 0.0)).sum()
            grad_a_n += (g * torch.where(positive, 0.0, torch.expm1(clamped) - u)).sum()
        return grad_x.view_as(x), grad_a_p * torch.sigmoid(a_p), grad_a_n * torch.sigmoid(a_n)

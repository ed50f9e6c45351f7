"""A small decoder-only transformer with mixture-of-experts feed-forward layers, in numpy,
with its backward pass written out by hand.

Tokens are bytes. Token and learned positional embeddings feed ``depth`` pre-norm blocks:
``h += attention(rmsnorm(h))`` (multi-head causal self-attention, heads of ``head_dim``),
then ``h += moe(rmsnorm(h))``. The MoE layer is token-choice: a router's softmax picks each
token's ``top_k`` experts (ReLU MLPs of ``4 * width``), each expert takes at most
``ceil(capacity_factor * tokens * top_k / num_experts)`` tokens and the
rest are dropped (their residual passes through unchanged; tokens are taken position by
position across the batch, so a later token never takes an earlier one's place and the
model stays causal), and each kept token's expert
output is weighted by its router probability. The Switch Transformer load-balancing loss,
``num_experts * sum_e f_e * P_e`` (``f_e`` the share of assignments routed to expert ``e``,
``P_e`` its mean router probability), is added with weight ``load_balance_coef``. A final
RMSNorm and an unembedding give next-byte logits.

``TinyTransformer.loss_and_grads`` returns the cross-entropy, the gradients of the objective
(cross-entropy plus the weighted balancing loss) and the MoE statistics;
tests/runs/test_tiny_moe.py checks the gradients against finite differences in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

EPS = 1e-6
FFN_MULT = 4


@dataclass
class MoEStats:
    dropped: int = 0  # token-to-expert assignments over an expert's capacity
    assigned: int = 0  # all assignments (tokens x top_k x layers)
    balance_loss: float = 0.0  # summed over layers, unweighted

    @property
    def drop_fraction(self) -> float:
        return self.dropped / max(self.assigned, 1)


def param_count(cfg: dict[str, Any], *, active: bool) -> int:
    """Parameters of the model ``cfg`` builds (``active``: with only ``top_k`` experts)."""
    d, e = cfg["width"], cfg["num_experts"]
    experts = cfg["top_k"] if active else e
    per_layer = 4 * d * d + d * e + experts * 2 * FFN_MULT * d * d + 2 * d
    return cfg["depth"] * per_layer + 2 * cfg["vocab_size"] * d + cfg["seq_len"] * d + d


def flops_per_token(cfg: dict[str, Any]) -> float:
    """Training FLOPs per token: 6 x active parameters, plus attention's scores and mixing
    (12 x depth x seq_len x width, as the PaLM paper counts them for MFU)."""
    return 6.0 * param_count(cfg, active=True) + 12.0 * cfg["depth"] * cfg["seq_len"] * cfg["width"]


def route(probs: np.ndarray, top_k: int, capacity: int) -> tuple[list[np.ndarray], int]:
    """Token-choice routing with a capacity limit: each row (a token) picks its ``top_k``
    most probable experts; each expert keeps the first ``capacity`` rows that picked it, in
    row order. Returns the kept rows of every expert and the number of dropped assignments."""
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    kept, dropped = [], 0
    for expert in range(probs.shape[1]):
        rows = np.nonzero((chosen == expert).any(axis=1))[0]
        dropped += max(0, len(rows) - capacity)
        kept.append(rows[:capacity])
    return kept, dropped


def _rmsnorm(x: np.ndarray, gain: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    scale = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)
    normed = x * scale
    return normed * gain, (normed, scale)


def _rmsnorm_back(
    dy: np.ndarray, gain: np.ndarray, cache: tuple[np.ndarray, ...]
) -> tuple[np.ndarray, np.ndarray]:
    normed, scale = cache
    dgain = (dy * normed).reshape(-1, dy.shape[-1]).sum(axis=0)
    dnormed = dy * gain
    dx = scale * (dnormed - normed * (dnormed * normed).mean(axis=-1, keepdims=True))
    return dx, dgain


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class TinyTransformer:
    def __init__(self, cfg: dict[str, Any], rng: Any, dtype: Any = np.float32) -> None:
        d, v, e, depth = cfg["width"], cfg["vocab_size"], cfg["num_experts"], cfg["depth"]
        f = FFN_MULT * d
        self.cfg, self.dtype = cfg, dtype
        self.heads = d // cfg["head_dim"]
        residual = 1.0 / math.sqrt(2 * depth)  # output projections: keep the stream's scale

        def normal(std: float, *shape: int) -> np.ndarray:
            return rng.normal(0.0, std, shape).astype(dtype)

        p: dict[str, np.ndarray] = {
            "tok": normal(0.02, v, d),
            "pos": normal(0.02, cfg["seq_len"], d),
            "norm_f": np.ones(d, dtype),
            "out": normal(1.0 / math.sqrt(d), d, v),
        }
        for i in range(depth):
            p[f"norm_a{i}"] = np.ones(d, dtype)
            p[f"qkv{i}"] = normal(1.0 / math.sqrt(d), d, 3 * d)
            p[f"proj{i}"] = normal(residual / math.sqrt(d), d, d)
            p[f"norm_m{i}"] = np.ones(d, dtype)
            p[f"router{i}"] = normal(1.0 / math.sqrt(d), d, e)
            p[f"w_in{i}"] = normal(1.0 / math.sqrt(d), e, d, f)
            p[f"w_out{i}"] = normal(residual / math.sqrt(f), e, f, d)
        self.params = p
        self._mask = np.zeros((0, 0), dtype)

    # -- attention -------------------------------------------------------------------------

    def _causal_mask(self, t: int) -> np.ndarray:
        """(t, t): 0 on and below the diagonal, -inf above it (the future)."""
        if self._mask.shape[0] != t:
            self._mask = np.triu(np.full((t, t), -np.inf, dtype=self.dtype), k=1)
        return self._mask

    def _attention(self, i: int, x: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        p, (b, t, d), h = self.params, x.shape, self.heads
        hd = d // h
        qkv = (x.reshape(-1, d) @ p[f"qkv{i}"]).reshape(b, t, 3, h, hd).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (b, h, t, hd)
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(hd))
        scores += self._causal_mask(t)  # a position sees itself and the past only
        weights = _softmax(scores)
        mixed = (weights @ v).transpose(0, 2, 1, 3).reshape(b * t, d)
        out = (mixed @ p[f"proj{i}"]).reshape(b, t, d)
        return out, {"x": x, "q": q, "k": k, "v": v, "weights": weights, "mixed": mixed}

    def _attention_back(
        self, i: int, dout: np.ndarray, c: dict[str, Any], g: dict[str, np.ndarray]
    ) -> np.ndarray:
        p, (b, t, d), h = self.params, dout.shape, self.heads
        hd = d // h
        flat = dout.reshape(b * t, d)
        g[f"proj{i}"] = c["mixed"].T @ flat
        dmixed = (flat @ p[f"proj{i}"].T).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
        weights = c["weights"]
        dv = weights.transpose(0, 1, 3, 2) @ dmixed
        dweights = dmixed @ c["v"].transpose(0, 1, 3, 2)
        dscores = weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
        dscores *= 1.0 / math.sqrt(hd)
        dq = dscores @ c["k"]
        dk = dscores.transpose(0, 1, 3, 2) @ c["q"]
        dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(b * t, 3 * d)
        g[f"qkv{i}"] = c["x"].reshape(b * t, d).T @ dqkv
        return (dqkv @ p[f"qkv{i}"].T).reshape(b, t, d)

    # -- mixture of experts ----------------------------------------------------------------

    def _moe(self, i: int, x: np.ndarray, stats: MoEStats) -> tuple[np.ndarray, dict[str, Any]]:
        p, cfg = self.params, self.cfg
        n, e, top_k = x.shape[0], cfg["num_experts"], cfg["top_k"]
        probs = _softmax(x @ p[f"router{i}"])
        capacity = max(1, math.ceil(cfg["capacity_factor"] * n * top_k / e))
        kept, dropped = route(probs, top_k, capacity)
        stats.dropped += dropped
        stats.assigned += n * top_k
        chosen = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
        routed = np.bincount(chosen.reshape(-1), minlength=e) / (n * top_k)  # f_e
        stats.balance_loss += float(e * (routed * probs.mean(axis=0)).sum())
        out = np.zeros_like(x)
        experts = []
        for expert, rows in enumerate(kept):
            gate = probs[rows, expert]
            pre = x[rows] @ p[f"w_in{i}"][expert]
            act = np.maximum(pre, 0)
            y = act @ p[f"w_out{i}"][expert]
            out[rows] += gate[:, None] * y
            experts.append((rows, gate, pre, act, y))
        return out, {"x": x, "probs": probs, "routed": routed, "experts": experts}

    def _moe_back(
        self, i: int, dout: np.ndarray, c: dict[str, Any], g: dict[str, np.ndarray]
    ) -> np.ndarray:
        p, cfg = self.params, self.cfg
        x, probs = c["x"], c["probs"]
        n, e = probs.shape
        dx = np.zeros_like(x)
        dprobs = np.zeros_like(probs)
        w_in, w_out = p[f"w_in{i}"], p[f"w_out{i}"]
        dw_in, dw_out = np.zeros_like(w_in), np.zeros_like(w_out)
        for expert, (rows, gate, pre, act, y) in enumerate(c["experts"]):
            if len(rows) == 0:
                continue
            drows = dout[rows]
            dprobs[rows, expert] += (drows * y).sum(axis=1)
            dy = drows * gate[:, None]
            dw_out[expert] = act.T @ dy
            dpre = (dy @ w_out[expert].T) * (pre > 0)
            dw_in[expert] = x[rows].T @ dpre
            dx[rows] += dpre @ w_in[expert].T
        # The balancing loss e * sum_e f_e * mean_n probs[n, e]: f_e is a count (no gradient).
        dprobs += cfg["load_balance_coef"] * e * c["routed"][None, :] / n
        dlogits = probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
        g[f"router{i}"] = x.T @ dlogits
        g[f"w_in{i}"], g[f"w_out{i}"] = dw_in, dw_out
        return dx + dlogits @ p[f"router{i}"].T

    # -- the whole model -------------------------------------------------------------------

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """Next-token logits, (batch, positions, vocab), of ``tokens`` (batch, positions)."""
        return self._forward(tokens, MoEStats())[0]

    def _forward(self, ids: np.ndarray, stats: MoEStats) -> tuple[np.ndarray, list[Any]]:
        p, cfg = self.params, self.cfg
        b, t = ids.shape
        d = cfg["width"]
        hidden = p["tok"][ids] + p["pos"][:t]
        caches: list[Any] = []
        for i in range(cfg["depth"]):
            normed, norm_a = _rmsnorm(hidden, p[f"norm_a{i}"])
            attended, attn = self._attention(i, normed)
            hidden = hidden + attended
            normed, norm_m = _rmsnorm(hidden, p[f"norm_m{i}"])
            # Position-major rows: an earlier position has the first claim on an expert's
            # capacity in every sequence, so what a later token does never drops an earlier one.
            rows = normed.transpose(1, 0, 2).reshape(t * b, d)
            mixed, moe = self._moe(i, rows, stats)
            hidden = hidden + mixed.reshape(t, b, d).transpose(1, 0, 2)
            caches.append((norm_a, attn, norm_m, moe))
        final, norm_f = _rmsnorm(hidden, p["norm_f"])
        caches.append((final, norm_f))
        return final @ p["out"], caches

    def loss_and_grads(
        self, tokens: np.ndarray, *, grads: bool = True
    ) -> tuple[float, dict[str, np.ndarray], MoEStats]:
        """Mean next-token cross-entropy over ``tokens`` (batch, positions + 1); the gradients
        are of that plus ``load_balance_coef`` x the balancing loss."""
        p, cfg = self.params, self.cfg
        ids, targets = tokens[:, :-1], tokens[:, 1:]
        b, t = ids.shape
        d = cfg["width"]
        stats = MoEStats()
        logits, caches = self._forward(ids, stats)
        flat = logits.reshape(b * t, -1)
        probs = _softmax(flat)
        picked = probs[np.arange(b * t), targets.reshape(-1)]
        loss = float(-np.log(np.maximum(picked, 1e-30)).mean())
        if not grads:
            return loss, {}, stats
        g: dict[str, np.ndarray] = {}
        dlogits = probs
        dlogits[np.arange(b * t), targets.reshape(-1)] -= 1
        dlogits /= b * t
        final, norm_f = caches.pop()
        g["out"] = final.reshape(b * t, d).T @ dlogits
        dfinal = (dlogits @ p["out"].T).reshape(b, t, d)
        dhidden, g["norm_f"] = _rmsnorm_back(dfinal, p["norm_f"], norm_f)
        for i in reversed(range(cfg["depth"])):
            norm_a, attn, norm_m, moe = caches[i]
            drows = dhidden.transpose(1, 0, 2).reshape(t * b, d)
            dnormed = self._moe_back(i, drows, moe, g).reshape(t, b, d).transpose(1, 0, 2)
            dx, g[f"norm_m{i}"] = _rmsnorm_back(dnormed, p[f"norm_m{i}"], norm_m)
            dhidden = dhidden + dx
            dnormed = self._attention_back(i, dhidden, attn, g)
            dx, g[f"norm_a{i}"] = _rmsnorm_back(dnormed, p[f"norm_a{i}"], norm_a)
            dhidden = dhidden + dx
        g["pos"] = np.zeros_like(p["pos"])
        g["pos"][:t] = dhidden.sum(axis=0)
        g["tok"] = np.zeros_like(p["tok"])
        np.add.at(g["tok"], ids.reshape(-1), dhidden.reshape(b * t, d))
        return loss, g, stats

#!/usr/bin/python3
"""Generate gradc's torch-reference corpus (tests/torchref/cases/), then check it.

    /usr/bin/python3 tests/torchref/gen.py            # write cases/*, then run the checks
    /usr/bin/python3 tests/torchref/gen.py --check    # only the checks, on the files there
    /usr/bin/python3 tests/torchref/gen.py --cases a,b  # (with --check) only these cases

Needs numpy and torch (Debian's /usr/bin/python3 has both).  Output is
deterministic.  Every number in the corpus comes from PyTorch, never from
gradc: each valid case below is a .gdl model written next to a hand-written
PyTorch twin (DESIGN.md section 2 semantics), run on the FULL batch in
float64 from the stored params and inputs.  Files per case:

    NAME.gdl                  the model (header comment: what it checks)
    NAME.params.safetensors   params, seeded (F32, or F64 for f64 params)
    NAME.inputs.safetensors   inputs (F32/F64, I32 targets and indices)
    NAME.ref.safetensors      F64 gradient of the total objective, one per param
    NAME.ref.json             every loss by name, and the total

Error cases get params and inputs only.  manifest.json lists every case in
the format of shared/conformance/check.py (so `check.py GRADC --manifest
tests/torchref/cases/manifest.json` runs it too) with a few extra keys that
tests/unit/test_torchref.c reads: "tol" (a tighter per-case tolerance) and
"expected_nerrors" (how many errors the file must produce).

The checks (all printed, any failure makes the script exit 1):
  1. float64 central finite differences agree with autograd on random
     coordinates of every param;
  2. DESIGN.md section 3: K micro-batches, whose batch means divide by the
     window's count and whose batch-independent terms carry weight 1/K, add
     up to the full batch (1e-12) for every K of a valid case; for a refusal
     case they do not (so gradc must refuse it);
  3. a float32 torch run lands within 2e-5 of the reference (the test
     tolerance is 1e-4), and every loss is far enough from 0 for a relative
     comparison, unless the case says it is exactly 0;
  4. each case's "mutants" (a plausible misreading of DESIGN.md: erf gelu,
     another eps, a max that gives ties' gradient to the first, ...) differ
     from the reference by more than 1e-3, so the case can tell them apart;
  5. the twin's losses are the .gdl's `loss` statements, in order;
  6. error locations: the `$` marker in each error source sits on the
     token the diagnostic must point at (the marker is removed on write).
"""
import sys
sys.dont_write_bytecode = True

import argparse
import json
import math
import os
import re
import struct
import zlib

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "cases")
IGNORE = -100


# ----------------------------------------------------------------------------
# safetensors: a minimal writer and reader (little-endian, header padded to 8)

ST_OF_NP = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64", np.dtype("<i4"): "I32", np.dtype("<i8"): "I64"}
NP_OF_ST = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def st_write(fname, tensors):
    """tensors: list of (name, numpy array) in file order."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        a = np.asarray(a)  # (ascontiguousarray would make a 0-d array 1-d)
        dt = ST_OF_NP[a.dtype.newbyteorder("<")]
        b = a.astype(NP_OF_ST[dt], order="C").tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(fname, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(fname):
    with open(fname, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=NP_OF_ST[e["dtype"]]).reshape(tuple(e["shape"]))
    return out


# ----------------------------------------------------------------------------
# How a twin reduces over the batch.  Twins call r.bmean wherever the .gdl
# takes a mean over axes that include the batch axis, r.ce / r.mse for the
# loss built-ins, and r.once around batch-independent terms.  `sum(x) / B`
# needs nothing: B as a value is the window size, d["B"], in every mode.

class FullBatch:
    """The reference: PyTorch semantics on whatever batch it is given."""
    K = 1

    def __init__(self, window):
        self.window = window  # integer inputs of the whole window, by name

    def nmean(self, x, dim):
        n = x.numel() if dim is None else math.prod(x.shape[a] for a in dim)
        return n * self.K

    def bmean(self, x, dim=None, keepdim=False):
        if dim is None:
            return x.sum() / self.nmean(x, None)
        dim = [dim] if isinstance(dim, int) else list(dim)
        return x.sum(dim=dim, keepdim=keepdim) / self.nmean(x, dim)

    def ce(self, logits, target, name, ignore_index=IGNORE, reduction="mean"):
        V = logits.shape[-1]
        l = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=ignore_index,
                            reduction="none").reshape(target.shape)
        if reduction == "none":
            return l
        if reduction == "sum":
            return l.sum()
        # DESIGN.md section 3: the window's non-ignored targets, at least 1
        return l.sum() / max(int((self.window[name] != ignore_index).sum()), 1)

    def mse(self, a, b, reduction="mean"):
        e = (a - b) ** 2
        return self.bmean(e) if reduction == "mean" else e.sum()

    def once(self, t):
        return t


class WindowPart(FullBatch):
    """One micro-batch of K under DESIGN.md section 3."""

    def __init__(self, window, K):
        super().__init__(window)
        self.K = K

    def once(self, t):
        return t / self.K


class PenaltyEveryPart(WindowPart):
    """Emulated bug: batch-independent terms counted in every micro-batch."""

    def once(self, t):
        return t


class MicroMeans(FullBatch):
    """Emulated bug: every mean is the micro-batch's own (no window count)."""

    def ce(self, logits, target, name, ignore_index=IGNORE, reduction="mean"):
        if reduction != "mean":
            return super().ce(logits, target, name, ignore_index, reduction)
        V = logits.shape[-1]
        l = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=ignore_index,
                            reduction="sum")
        return l / max(int((target != ignore_index).sum()), 1)


# ----------------------------------------------------------------------------
# DESIGN.md section 2 built-ins that torch spells differently

def gelu(x):
    return F.gelu(x, approximate="tanh")


def layer_norm(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def causal_mask(x):
    T1, T2 = x.shape[-2], x.shape[-1]
    above = torch.ones(T1, T2, dtype=torch.bool).triu(1)
    return x.masked_fill(above, float("-inf"))


class Detach:
    """detach(x) of DESIGN.md.  For finite differences the detached values are
    recorded at the base point and replayed unchanged at perturbed points (a
    detached value is a constant to the gradient)."""
    mode, saved, i = None, [], 0

    def __call__(self, x):
        if self.mode == "record":
            self.saved.append(x.detach().clone())
        elif self.mode == "replay":
            self.i += 1
            return self.saved[self.i - 1]
        return x.detach()


detach = Detach()


def amax(x, dim=None, keepdim=False):
    if dim is None:
        dim = tuple(range(x.dim()))
    return torch.amax(x, dim=dim, keepdim=keepdim)


def rsqrt_c(n):
    return 1.0 / math.sqrt(n)


# ----------------------------------------------------------------------------
# Data generators: f(rng, shape, np_dtype) -> array

def normal(std=0.5, mean=0.0):
    return lambda rng, shape, dt: (mean + std * rng.standard_normal(shape)).astype(dt)


def uniform(lo, hi):
    return lambda rng, shape, dt: rng.uniform(lo, hi, size=shape).astype(dt)


def ints(lo, hi):
    """Integers in [lo, hi)."""
    return lambda rng, shape, dt: rng.integers(lo, hi, size=shape).astype(np.int32)


def targets(V, valid=None, ignore=IGNORE, avoid_ignore=True):
    """Class targets in [0, V); sample i keeps valid[i] of its positions (at
    random), the others are `ignore`."""
    def gen(rng, shape, dt):
        lo = np.arange(V)
        if avoid_ignore:
            lo = lo[lo != ignore]
        y = rng.choice(lo, size=shape).astype(np.int32)
        if valid is not None:
            flat = y.reshape(shape[0], -1)
            assert len(valid) == shape[0]
            for i, n in enumerate(valid):
                flat[i, rng.permutation(flat.shape[1])[n:]] = ignore
        return y
    return gen


def dupes(rng, shape, dt):
    """Normal values with exact duplicates inside each row."""
    a = rng.standard_normal(shape).astype(dt)
    a[..., 1::3] = a[..., 0::3][..., :a[..., 1::3].shape[-1]]
    return a


# ----------------------------------------------------------------------------
# The cases.  Each valid case: name, gas values, the .gdl source and its
# twin (P: params, I: inputs, r: reducer, d: dims with the window B).

CASES = []
REFUSALS = []
ERRORS = []


def case(name, gas, what, src, init=None, data=None, tie=None, mutants=None, tol=None,
         zero_losses=(), refuse=None, fd_skip=(), checks=(), i64=False):
    def reg(fn):
        (REFUSALS if refuse else CASES).append(dict(
            name=name, gas=gas, what=what, src=src, twin=fn, init=init or {}, data=data or {},
            tie=tie or {}, mutants=mutants or {}, tol=tol, zero_losses=set(zero_losses), refuse=refuse,
            fd_skip=set(fd_skip), checks=list(checks), i64=i64))
        return fn
    return reg


def error_case(name, what, src, shapes=(), nerrors=None):
    ERRORS.append(dict(name=name, what=what, src=src, shapes=list(shapes), nerrors=nerrors))


# -- element-wise math ---------------------------------------------------------

@case("unary_a", [1, 2, 4],
      "exp log sqrt rsqrt tanh, one loss and one weight each, rebinding z",
      """
model unary_a {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x  : f32[B, D]
  param We : f32[D, H]
  param Wl : f32[D, H]
  param Ws : f32[D, H]
  param Wr : f32[D, H]
  param Wt : f32[D, H]

  z = x @ We
  loss e = mean(exp(z))
  z = x @ Wl
  loss l = mean(log(1 + z * z))
  z = x @ Ws
  loss s = mean(sqrt(z * z + 0.5))
  z = x @ Wr
  loss r = mean(rsqrt(z * z + 0.25))
  z = x @ Wt
  loss t = mean(tanh(z + 1.0))
}
""")
def _(P, I, r, d):
    x = I["x"]
    L = {}
    z = x @ P["We"]
    L["e"] = r.bmean(torch.exp(z))
    z = x @ P["Wl"]
    L["l"] = r.bmean(torch.log(1 + z * z))
    z = x @ P["Ws"]
    L["s"] = r.bmean(torch.sqrt(z * z + 0.5))
    z = x @ P["Wr"]
    L["r"] = r.bmean(torch.rsqrt(z * z + 0.25))
    z = x @ P["Wt"]
    L["t"] = r.bmean(torch.tanh(z + 1.0))
    return L


def unary_b(P, I, r, d, act_gelu=gelu):
    x = I["x"]
    return {"sg": r.bmean(torch.sigmoid(x @ P["Wg"])),
            "rl": r.bmean(torch.relu(x @ P["Wr"])),
            "ge": r.bmean(act_gelu(x @ P["Wu"] - 2)),
            "si": r.bmean(F.silu(x @ P["Wi"])),
            "ab": r.bmean(torch.abs(x @ P["Wa"]))}


case("unary_b", [1, 2, 4],
     "sigmoid relu gelu (tanh approximation, told from erf near -2) silu abs, one loss and one weight each",
     """
model unary_b {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x  : f32[B, D]
  param Wg : f32[D, H]
  param Wr : f32[D, H]
  param Wu : f32[D, H]
  param Wi : f32[D, H]
  param Wa : f32[D, H]

  loss sg = mean(sigmoid(x @ Wg))
  loss rl = mean(relu(x @ Wr))
  loss ge = mean(gelu(x @ Wu - 2))
  loss si = mean(silu(x @ Wi))
  loss ab = mean(abs(x @ Wa))
}
""", init={"Wu": normal(0.3)},
     mutants={"erf gelu": lambda P, I, r, d: unary_b(P, I, r, d, act_gelu=F.gelu)})(unary_b)


@case("minmax", [1, 2],
      "maximum and minimum: tensor-tensor, broadcast against a [H] param, and against constants",
      """
model minmax {
  batch B = 8
  dim   D = 4
  dim   H = 5

  input x  : f32[B, D]
  input y  : f32[B, H]
  param Wa : f32[D, H]
  param c  : f32[H]

  a = x @ Wa
  loss mx = mean(maximum(a, y))
  loss mn = mean(minimum(a, c) ** 2)
  loss mz = mean(maximum(a, 0) + minimum(a, 0.5) * 2)
}
""")
def _(P, I, r, d):
    a = I["x"] @ P["Wa"]
    zero = torch.zeros((), dtype=a.dtype)
    half = torch.full((), 0.5, dtype=a.dtype)
    return {"mx": r.bmean(torch.maximum(a, I["y"])),
            "mn": r.bmean(torch.minimum(a, P["c"]) ** 2),
            "mz": r.bmean(torch.maximum(a, zero) + torch.minimum(a, half) * 2)}


# -- matmul and shapes ---------------------------------------------------------

@case("matmul_shapes", [1, 2, 4],
      "matmul: 2-D @ 2-D (matmul call), 2-D @ 1-D, 3-D @ 2-D, 3-D @ 3-D (both batched), "
      "4-D @ 3-D with broadcast, 1-D @ 2-D, 1-D @ 3-D, 1-D @ 1-D; the last three make a "
      "batch-independent loss (counted once per window)",
      """
model matmul_shapes {
  batch B = 8
  dim   T = 3
  dim   D = 4
  dim   E = 5
  dim   H = 2

  input x  : f32[B, T, D]
  input v  : f32[D]
  param W2 : f32[D, E]
  param W3 : f32[D, E]
  param Wb : f32[H, D, E]
  param u  : f32[E]
  param Wv : f32[D, E]
  param p  : f32[E]

  h = x @ W2                                # [B, T, E]
  loss m1 = mean(tanh(h[:, 0] @ u) + 1)     # [B, E] @ [E] -> [B]
  g = reshape(x, [B, 1, T, D]) @ Wb         # [B, 1, T, D] @ [H, D, E] -> [B, H, T, E]
  loss m4 = mean(g * g)
  k = h @ transpose(x @ W3, 1, 2)           # [B, T, E] @ [B, E, T] -> [B, T, T]
  loss bb = mean(sigmoid(k))
  loss m2 = mean(matmul(x[:, 0], W2) ** 2)  # [B, D] @ [D, E]
  loss vv = (v @ Wv) @ p + mean(tanh(v @ Wb)) + 2
}
""")
def _(P, I, r, d):
    x, v = I["x"], I["v"]
    b = x.shape[0]
    h = x @ P["W2"]
    g = x.reshape(b, 1, x.shape[1], x.shape[2]) @ P["Wb"]
    k = h @ (x @ P["W3"]).transpose(1, 2)
    return {"m1": r.bmean(torch.tanh(h[:, 0] @ P["u"]) + 1),
            "m4": r.bmean(g * g),
            "bb": r.bmean(torch.sigmoid(k)),
            "m2": r.bmean(torch.matmul(x[:, 0], P["W2"]) ** 2),
            "vv": r.once((v @ P["Wv"]) @ P["p"] + torch.tanh(v @ P["Wb"]).mean() + 2)}


@case("matmul_vec", [1, 2, 4],
      "matmul of a batched 3-D operand with a 1-D one on either side: [B, T, E] @ [E] -> "
      "[B, T] and [T] @ [B, T, E] -> [B, E] (the batch axis stays axis 0)",
      """
model matmul_vec {
  batch B = 8
  dim   T = 3
  dim   E = 5

  input x : f32[B, T, E]
  param u : f32[E]
  param w : f32[T]

  loss m3 = mean(tanh(x @ u) + 1)
  loss m5 = mean(sigmoid(w @ x))
}
""")
def _(P, I, r, d):
    x = I["x"]
    return {"m3": r.bmean(torch.tanh(x @ P["u"]) + 1), "m5": r.bmean(torch.sigmoid(P["w"] @ x))}


@case("shape_ops", [1, 2, 4],
      "transpose (negative axes), permute (moving the batch axis; then a max over the new "
      "axis 0, which is not the batch), reshape with -1 "
      "(of a param, and in the middle) and with B (the micro-batch) in the target",
      """
model shape_ops {
  batch B = 8
  dim   T = 3
  dim   C = 4
  dim   H = 6

  input x : f32[B, T, C]
  param W : f32[C, H]
  param U : f32[T, H]
  param S : f32[H, T]

  h = x @ W                                  # [B, T, H]
  g = reshape(tanh(h), [B, T * H])
  loss a = mean(g * reshape(U, [-1]))
  loss b = sum(transpose(h, -1, -2) * S) / B   # [B, H, T] * [H, T]
  loss c = mean(reshape(h, [B, -1, 2])[:, :, 0] ** 2)
  loss d = mean(exp(permute(h, [2, 0, 1]) * 0.5))
  loss e = mean(sigmoid(permute(h, [0, 2, 1]) @ U))   # [B, H, T] @ [T, H]
  loss f = mean(max(transpose(h, 0, 2), axis=0))      # [H, T, B]: max over H, not the batch
}
""")
def _(P, I, r, d):
    x = I["x"]
    b, T = x.shape[0], x.shape[1]
    H = P["W"].shape[1]
    h = x @ P["W"]
    g = torch.tanh(h).reshape(b, T * H)
    return {"a": r.bmean(g * P["U"].reshape(-1)),
            "b": (h.transpose(-1, -2) * P["S"]).sum() / d["B"],
            "c": r.bmean(h.reshape(b, -1, 2)[:, :, 0] ** 2),
            "d": r.bmean(torch.exp(h.permute(2, 0, 1) * 0.5)),
            "e": r.bmean(torch.sigmoid(h.permute(0, 2, 1) @ P["U"])),
            "f": r.bmean(amax(h.transpose(0, 2), 0))}


@case("reshape_merge_batch", [1, 2, 4],
      "reshape(h, [-1, H]) merges the batch axis with T (each micro-batch's rows stay "
      "together), a per-row op, then reshape back to [B, T * H]",
      """
model reshape_merge_batch {
  batch B = 8
  dim   T = 3
  dim   C = 4
  dim   H = 6

  input x : f32[B, T, C]
  param W : f32[C, H]
  param U : f32[T, H]

  f = reshape(x @ W, [-1, H])                # [B*T, H]
  g = reshape(tanh(f), [B, T * H])
  loss a = mean(g * reshape(U, [-1]) + 1)
}
""")
def _(P, I, r, d):
    x = I["x"]
    b, T = x.shape[0], x.shape[1]
    H = P["W"].shape[1]
    f = (x @ P["W"]).reshape(-1, H)
    g = torch.tanh(f).reshape(b, T * H)
    return {"a": r.bmean(g * P["U"].reshape(-1) + 1)}


# -- reductions ------------------------------------------------------------------

@case("reductions", [1, 2, 4],
      "sum/mean/max with axis as int, list, negative, positional, keepdim; "
      "`sum(..) / B` divides by the window B",
      """
model reductions {
  batch B = 8
  dim   T = 4
  dim   H = 5

  input x  : f32[B, T, H]
  param W  : f32[H, H]
  param w1 : f32[H]
  param w2 : f32[T]

  h = tanh(x @ W)                                            # [B, T, H]
  loss s_int  = sum(sum(h, axis=1) * w1) / B
  loss s_pos  = mean(sum(h * h, 1) * w1)
  loss m_list = mean(mean(h * w1, axis=[1, 2]) + 2)
  loss m_neg  = mean(mean(h, axis=-1) * w2 + 1)
  loss m_keep = sum(mean(h, axis=1, keepdim=true) * w1) / B
  loss x_keep = mean(exp(h - max(h, axis=-1, keepdim=true)))
  loss x_int  = mean(max(h * w1, axis=1))
  loss x_list = mean(max(h, axis=[1, 2]))
  loss s_negl = mean(sum(h, [-1, -2]) ** 2)
}
""")
def _(P, I, r, d):
    h = torch.tanh(I["x"] @ P["W"])
    w1, w2 = P["w1"], P["w2"]
    return {"s_int": (h.sum(dim=1) * w1).sum() / d["B"],
            "s_pos": r.bmean((h * h).sum(dim=1) * w1),
            "m_list": r.bmean((h * w1).mean(dim=[1, 2]) + 2),
            "m_neg": r.bmean(h.mean(dim=-1) * w2 + 1),
            "m_keep": (h.mean(dim=1, keepdim=True) * w1).sum() / d["B"],
            "x_keep": r.bmean(torch.exp(h - amax(h, -1, keepdim=True))),
            "x_int": r.bmean(amax(h * w1, 1)),
            "x_list": r.bmean(amax(h, (1, 2))),
            "s_negl": r.bmean(h.sum(dim=[-1, -2]) ** 2)}


def max_ties(P, I, r, d, first_only=False):
    x = I["x"]
    z = torch.cat([x @ P["W1"], x @ P["W2"], x @ P["W1"]], dim=1)   # [B, 3H], 3-way ties
    if first_only:  # torch.max(dim) style: the whole gradient to one element
        m = z.max(dim=1).values
    else:
        m = amax(z, 1)
    q = torch.cat([P["W3"], P["W3"]], dim=0)
    return {"m": r.bmean(m), "p": r.once(0.1 * amax(torch.abs(q)) + 0.2 * amax(q, 0).sum())}


case("max_ties", [1, 2, 4],
     "max reduction with exact 3-way ties (W2 holds W1's values): the gradient is split evenly "
     "(W1 gets 2/3, W2 1/3), and a max over a param (a penalty) with ties between copies",
     """
model max_ties {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x  : f32[B, D]
  param W1 : f32[D, H]
  param W2 : f32[D, H]
  param W3 : f32[D, H]

  z = concat([x @ W1, x @ W2, x @ W1], axis=1)   # [B, 3H]: every max is a 3-way tie
  loss m = mean(max(z, axis=1))
  q = concat([W3, W3], axis=0)
  loss p = 0.1 * max(abs(q)) + 0.2 * sum(max(q, axis=0))
}
""", tie={"W2": "W1"},
     # At a tie the function has no derivative; central differences see the
     # average of the one-sided slopes (1/2 for W1, 1/2 for W2 here), not the
     # even split, so W1 and W2 are checked by the split itself.
     fd_skip=["W1", "W2"],
     checks=[lambda G: None if torch.allclose(G["W1"], 2 * G["W2"], rtol=1e-12, atol=0)
             else "grad W1 is not 2 * grad W2 (even split of 3-way ties)"],
     mutants={"max grad to one tie": lambda P, I, r, d: max_ties(P, I, r, d, first_only=True)})(max_ties)


@case("softmax_axes", [1, 2, 4],
      "logsumexp over the last and a middle axis (positional and keyword), softmax and "
      "log_softmax over axis -1 (also by default), 1 and 2",
      """
model softmax_axes {
  batch B = 8
  dim   T = 3
  dim   H = 4

  input x : f32[B, T, H]
  input t : f32[B, T, H]
  param W : f32[H, H]
  param c : f32[H]
  param e : f32[T, 1]

  h = x @ W
  loss lse1 = mean(logsumexp(h, axis=-1))
  loss lse2 = mean(logsumexp(h, 1) * c)
  loss sm1  = mean((softmax(h, axis=-1) - 0.1) ** 2 + softmax(h) * c)
  loss sm2  = mean(softmax(h, axis=1) * e * t + 1)
  loss sm3  = mean(softmax(h, 2) * t + 1)
  loss ls1  = -mean(log_softmax(h, axis=-1) * t)
  loss ls2  = mean(log_softmax(h, axis=1) ** 2)
  loss ls3  = mean(log_softmax(h) * c)
}
""", init={"W": normal(0.8)}, data={"t": uniform(0.0, 1.0)})
def _(P, I, r, d):
    h = I["x"] @ P["W"]
    c, e, t = P["c"], P["e"], I["t"]
    return {"lse1": r.bmean(torch.logsumexp(h, -1)),
            "lse2": r.bmean(torch.logsumexp(h, 1) * c),
            "sm1": r.bmean((F.softmax(h, -1) - 0.1) ** 2 + F.softmax(h, -1) * c),
            "sm2": r.bmean(F.softmax(h, 1) * e * t + 1),
            "sm3": r.bmean(F.softmax(h, 2) * t + 1),
            "ls1": -r.bmean(F.log_softmax(h, -1) * t),
            "ls2": r.bmean(F.log_softmax(h, 1) ** 2),
            "ls3": r.bmean(F.log_softmax(h, -1) * c)}


def norms(P, I, r, d, ln_eps=1e-5, rms_eps=1e-6):
    h = I["x"] @ P["W"]
    t = I["t"]
    return {"ln": r.mse(layer_norm(h, P["g1"], P["b1"], ln_eps), t),
            "ln2": r.mse(layer_norm(h, P["g2"], P["b2"], 1e-2), t),
            "rm": r.mse(rms_norm(h, P["r1"], rms_eps), t),
            "rm2": r.mse(rms_norm(h, P["r2"], 1e-3), t)}


case("norms", [1, 2, 4],
     "layer_norm (default eps 1e-5, and eps=1e-2) and rms_norm (default eps 1e-6, and a "
     "positional 1e-3) on rows of small variance, so that the eps values matter",
     """
model norms {
  batch B = 8
  dim   T = 2
  dim   C = 6

  input x  : f32[B, T, C]
  input t  : f32[B, T, C]
  param W  : f32[C, C]
  param g1 : f32[C]
  param b1 : f32[C]
  param g2 : f32[C]
  param b2 : f32[C]
  param r1 : f32[C]
  param r2 : f32[C]

  h = x @ W
  loss ln  = mse_loss(layer_norm(h, g1, b1), t)
  loss ln2 = mse_loss(layer_norm(h, g2, b2, eps=1e-2), t)
  loss rm  = mse_loss(rms_norm(h, r1), t)
  loss rm2 = mse_loss(rms_norm(h, r2, 1e-3), t)
}
""", init={"W": normal(0.08), "g1": normal(0.1, 1.0), "g2": normal(0.1, 1.0),
           "r1": normal(0.1, 1.0), "r2": normal(0.1, 1.0)},
     data={"x": normal(0.1)},
     mutants={"layer_norm eps 1e-6": lambda P, I, r, d: norms(P, I, r, d, ln_eps=1e-6),
              "rms_norm eps 1e-5": lambda P, I, r, d: norms(P, I, r, d, rms_eps=1e-5)})(norms)


@case("attention", [1, 2, 4],
      "single-head causal self-attention: q @ transpose(k) * rsqrt(C), causal_mask, "
      "softmax, @ v; rsqrt of a dim as a value",
      """
model attention {
  batch B = 4
  dim   T = 5
  dim   C = 6

  input x  : f32[B, T, C]
  input t  : f32[B, T, C]
  param Wq : f32[C, C]
  param Wk : f32[C, C]
  param Wv : f32[C, C]

  q = x @ Wq
  k = x @ Wk
  v = x @ Wv
  att = softmax(causal_mask(q @ transpose(k, 1, 2) * rsqrt(C)), axis=-1)
  loss a = mse_loss(att @ v, t)
}
""", init={"Wq": normal(0.8), "Wk": normal(0.8)})
def _(P, I, r, d):
    x = I["x"]
    q, k, v = x @ P["Wq"], x @ P["Wk"], x @ P["Wv"]
    att = F.softmax(causal_mask(q @ k.transpose(1, 2) * rsqrt_c(d["C"])), dim=-1)
    return {"a": r.mse(att @ v, I["t"])}


@case("embedding_tied", [1, 2, 4],
      "embedding with repeated tokens, a position table, and logits tied to the same "
      "table (a param used twice)",
      """
model embedding_tied {
  batch B = 8
  dim   T = 4
  dim   V = 10
  dim   C = 6

  input tok : i32[B, T]
  input lbl : i32[B, T]
  param E   : f32[V, C]
  param Pos : f32[T, C]
  param W   : f32[C, C]

  h = embedding(tok, E) + Pos
  h = tanh(h @ W)
  logits = h @ transpose(E, 0, 1)
  loss ce = cross_entropy(logits, lbl)
}
""", init={"E": normal(0.8), "W": normal(0.6)}, data={"tok": ints(0, 10), "lbl": targets(10)})
def _(P, I, r, d):
    h = F.embedding(I["tok"], P["E"]) + P["Pos"]
    h = torch.tanh(h @ P["W"])
    return {"ce": r.ce(h @ P["E"].t(), I["lbl"], "lbl")}


@case("concat_index", [1, 2, 4],
      "slicing and indexing: qkv[..., k*C:(k+1)*C], x[:, 0:C], negative indices and "
      "slices, steps (::2, 1:6:2), an integer index dropping an axis; concat on axes 1, -1 "
      "and of three tensors",
      """
model concat_index {
  batch B = 8
  dim   T = 6
  dim   C = 3

  input x : f32[B, T, C]
  param W : f32[C, 3*C]
  param u : f32[C]

  qkv = tanh(x @ W)                    # [B, T, 3C]
  q = qkv[..., 0:C]
  k = qkv[..., C:2*C]
  v = qkv[..., 2*C:3*C]
  loss a = mean(q * k + v * u + 1)
  last = qkv[:, -1]                    # [B, 3C]
  first = last[:, 0:C]                 # [B, C]
  loss b = mean(qkv[:, ::2, :] * qkv[:, 1:6:2] + 1)
  loss c = mean(concat([last, first * u], axis=1) ** 2)
  loss d = mean(concat([qkv[:, -3:-1, -C:], qkv[:, 0:2, 0:C]], axis=-1) * u[-1] + u[0])
  loss e = mean(concat([q, k * 2, v * 3], axis=1) ** 2)
}
""", init={"u": normal(0.5, 1.0)})
def _(P, I, r, d):
    C = d["C"]
    u = P["u"]
    qkv = torch.tanh(I["x"] @ P["W"])
    q, k, v = qkv[..., 0:C], qkv[..., C:2 * C], qkv[..., 2 * C:3 * C]
    last = qkv[:, -1]
    first = last[:, 0:C]
    return {"a": r.bmean(q * k + v * u + 1),
            "b": r.bmean(qkv[:, ::2, :] * qkv[:, 1:6:2] + 1),
            "c": r.bmean(torch.cat([last, first * u], dim=1) ** 2),
            "d": r.bmean(torch.cat([qkv[:, -3:-1, -C:], qkv[:, 0:2, 0:C]], dim=-1) * u[-1] + u[0]),
            "e": r.bmean(torch.cat([q, k * 2, v * 3], dim=1) ** 2)}


@case("stacked_for", [1, 2, 4],
      "`for` loops over stacked params (W[l], b[l]), bounds that are dim expressions "
      "(1..L+1), x rebound in the loop, a negative layer index; S[0] is never used, so "
      "its gradient rows are zero",
      """
model stacked_for {
  batch B = 8
  dim   D = 5
  dim   L = 3
  dim   C = 4

  input x  : f32[B, D]
  input y  : i32[B]
  param W  : f32[L, D, D]
  param b  : f32[L, D]
  param S  : f32[L+1, D]
  param Wo : f32[D, C]

  h = x
  for l in 0..L {
    h = h + tanh(h @ W[l] + b[l])
  }
  for i in 1..L+1 {
    h = h * sigmoid(S[i])
  }
  loss ce = cross_entropy(h @ Wo, y)
  loss p  = 0.01 * sum(W[-1] * W[-1])
}
""", init={"W": normal(0.4)}, data={"y": targets(4)})
def _(P, I, r, d):
    h = I["x"]
    for l in range(d["L"]):
        h = h + torch.tanh(h @ P["W"][l] + P["b"][l])
    for i in range(1, d["L"] + 1):
        h = h * torch.sigmoid(P["S"][i])
    return {"ce": r.ce(h @ P["Wo"], I["y"], "y"), "p": r.once(0.01 * (P["W"][-1] ** 2).sum())}


def pow_prec(P, I, r, d, neg_first=False):
    z = I["x"] @ P["W"]
    p = torch.sigmoid(z) + 0.5
    c = P["c"]
    pr = ((-z) ** 2) if neg_first else -(z ** 2)
    return {"i2": r.bmean(z ** 2),
            "i3": r.bmean(z ** 3 + 4),
            "fr": r.bmean(p ** 0.5 + p ** 1.5 * c),
            "ng": r.bmean(p ** -1 + p ** -0.5 * c),
            "pr": r.bmean(pr + 3),
            "pn": r.bmean(2 - p ** -2),
            "pz": r.bmean(-p ** 3 * c + 2 * -z)}


case("pow_prec", [1, 2, 4],
     "`**` with integer (2, 3), fractional (0.5, 1.5) and negative (-1, -0.5, -2) exponents; "
     "`-z ** 2` is -(z ** 2) (told from (-z) ** 2); `2 * -z`",
     """
model pow_prec {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x : f32[B, D]
  param W : f32[D, H]
  param c : f32[H]

  z = x @ W
  p = sigmoid(z) + 0.5
  loss i2 = mean(z ** 2)
  loss i3 = mean(z ** 3 + 4)
  loss fr = mean(p ** 0.5 + p ** 1.5 * c)
  loss ng = mean(p ** -1 + p ** -0.5 * c)
  loss pr = mean(-z ** 2 + 3)
  loss pn = mean(2 - p ** -2)
  loss pz = mean(-p ** 3 * c + 2 * -z)
}
""", init={"c": normal(0.3, 1.0)},
     mutants={"(-z) ** 2": lambda P, I, r, d: pow_prec(P, I, r, d, neg_first=True)})(pow_prec)


@case("pow_assoc", [1, 2],
      "`**` is right-associative: p ** 2 ** -1 is p ** 0.5 (told from (p ** 2) ** -1)",
      """
model pow_assoc {
  batch B = 4
  dim   D = 3

  input x : f32[B, D]
  param W : f32[D, D]

  p = sigmoid(x @ W) + 0.5
  loss ra = mean(p ** 2 ** -1)
}
""", mutants={"left-assoc": lambda P, I, r, d: {
    "ra": r.bmean((torch.sigmoid(I["x"] @ P["W"]) + 0.5) ** -2)}})
def _(P, I, r, d):
    p = torch.sigmoid(I["x"] @ P["W"]) + 0.5
    return {"ra": r.bmean(p ** 0.5)}


@case("dims_values", [1, 2, 4],
      "dims as values: `sum(..) / B` (the window B, not the micro-batch), (B * H), "
      "rsqrt(D / 2), a derived dim G = H / 2, `- D + H`; B in a reshape target is the micro-batch",
      """
model dims_values {
  batch B = 8
  dim   D = 4
  dim   H = 6
  dim   G = H / 2

  input x : f32[B, D]
  param W : f32[D, H]

  z = x @ W
  loss s = sum(z * z) / B
  loss t = sum(tanh(z)) / (B * H) + 1
  loss u = mean(z * rsqrt(D / 2) + G)
  loss v = sum(z ** 2) / (2 * B) - D + H
  loss w = sum(reshape(z, [B, G, 2]) ** 2) / B
}
""")
def _(P, I, r, d):
    B, D, H, G = d["B"], d["D"], d["H"], d["G"]
    z = I["x"] @ P["W"]
    return {"s": (z * z).sum() / B,
            "t": torch.tanh(z).sum() / (B * H) + r.once(torch.tensor(1.0, dtype=z.dtype)),
            "u": r.bmean(z * rsqrt_c(D // 2) + G),
            "v": (z ** 2).sum() / (2 * B) + r.once(torch.tensor(float(H - D), dtype=z.dtype)),
            "w": (z.reshape(z.shape[0], G, 2) ** 2).sum() / B}


@case("fn_inline", [1, 2, 4],
      "fn inlining: a fn calling a fn, rebinding inside a fn, params seen from a fn body, "
      "the same fn called twice (shared weights), top-level rebinding",
      """
model fn_inline {
  batch B = 8
  dim   D = 4
  dim   H = 6

  input x  : f32[B, D]
  input t  : f32[B, D]
  param W1 : f32[D, H]
  param b1 : f32[H]
  param W2 : f32[H, D]
  param b2 : f32[D]

  fn lin(a, w, c) {
    return a @ w + c
  }

  fn mlp2(a) {
    u = lin(a, W1, b1)
    u = tanh(u)
    return lin(u, W2, b2)
  }

  h = mlp2(x)
  h = h + mlp2(h)
  loss m = mse_loss(h, t)
}
""")
def _(P, I, r, d):
    def mlp2(a):
        u = torch.tanh(a @ P["W1"] + P["b1"])
        return u @ P["W2"] + P["b2"]
    h = mlp2(I["x"])
    h = h + mlp2(h)
    return {"m": r.mse(h, I["t"])}


@case("f64_model", [1, 2, 4],
      "f64 params and inputs (values that f32 cannot hold): gradients come back as F64, "
      "compared at 1e-9",
      """
model f64_model {
  batch B = 8
  dim   D = 4
  dim   H = 5
  dim   C = 3

  input x : f64[B, D]
  input y : i32[B]
  param W : f64[D, H]
  param b : f64[H]
  param V : f64[H, C]

  loss ce = cross_entropy(tanh(x @ W + b) @ V, y)
  loss l2 = 1e-3 * sum(W * W)
}
""", tol=1e-9, data={"y": targets(3)})
def _(P, I, r, d):
    return {"ce": r.ce(torch.tanh(I["x"] @ P["W"] + P["b"]) @ P["V"], I["y"], "y"),
            "l2": r.once(1e-3 * (P["W"] ** 2).sum())}


@case("i64_inputs", [1, 2],
      "i32 inputs that arrive as I64 in the inputs file (DESIGN.md section 2: accepted, "
      "range-checked): token indices and class targets",
      """
model i64_inputs {
  batch B = 6
  dim   T = 3
  dim   V = 7
  dim   C = 5

  input tok : i32[B, T]
  input y   : i32[B]
  param E   : f32[V, C]
  param W   : f32[C, 4]

  h = mean(tanh(embedding(tok, E)), axis=1)    # [B, C]
  loss ce = cross_entropy(h @ W, y)
}
""", i64=True, init={"E": normal(0.8), "W": normal(0.8)}, data={"tok": ints(0, 7), "y": targets(4)})
def _(P, I, r, d):
    h = torch.tanh(F.embedding(I["tok"], P["E"])).mean(dim=1)
    return {"ce": r.ce(h @ P["W"], I["y"], "y")}


@case("syntax_misc", [1, 2, 4],
      "syntax: `;` between statements (declarations too), a call spanning lines inside () "
      "and [], nested `for`, a `for` inside a fn rebinding its argument, M[i, j] and M[i][j], "
      "`...` with an integer index, unary minus before indexing, a scalar f32 param, init "
      "clauses (ignored by run)",
      """
model syntax_misc {
  batch B = 8
  dim   D = 4; dim H = 3
  dim   L = 2

  input x : f32[B, D]
  input y : i32[B]
  param W : f32[D, H]     init uniform(-0.5, 0.5)
  param s : f32           init ones
  param M : f32[L, L, H]  init normal(0, 0.5)

  fn diag(t) {
    for k in 0..L {
      t = t + M[k][k]
    }
    return t
  }

  a = x @ W; h = tanh(a) * s
  g = concat([h,
              h * 2],
             axis=1)
  for i in 0..L {
    for j in 0..L {
      h = h + M[i, j] * 0.5
    }
  }
  loss ce = cross_entropy(diag(h), y)
  loss e  = mean(g[..., 0] ** 2) + mean(-h[:, -1]) + 2
}
""", init={"s": normal(0.2, 1.0)}, data={"y": targets(3)})
def _(P, I, r, d):
    L, M = d["L"], P["M"]
    h = torch.tanh(I["x"] @ P["W"]) * P["s"]
    g = torch.cat([h, h * 2], dim=1)
    for i in range(L):
        for j in range(L):
            h = h + M[i, j] * 0.5
    t = h
    for k in range(L):
        t = t + M[k][k]
    two = torch.tensor(2.0, dtype=h.dtype)
    return {"ce": r.ce(t, I["y"], "y"), "e": r.bmean(g[..., 0] ** 2) + r.bmean(-h[:, -1]) + r.once(two)}


@case("param_axis0", [1, 2, 4],
      "reductions over axis 0 of tensors without a batch axis (a param, an unbatched input) "
      "are not batch reductions: softmax, log_softmax, logsumexp, max, mean, slicing and "
      "indexing over axis 0 of W are fine with any --gas",
      """
model param_axis0 {
  batch B = 8
  dim   N = 8
  dim   D = 4
  dim   H = 3

  input x : f32[B, D]
  input z : f32[N, H]
  param W : f32[D, H]
  param V : f32[D, H]

  loss a = mean(tanh(x @ (softmax(W, axis=0) + V)))
  loss p = 0.1 * sum(logsumexp(W, 0)) + 0.1 * sum(max(V, axis=0)) + sum(mean(z, axis=0) * W[0])
  loss q = mean(log_softmax(V, axis=0) * W) + sum(W[1:3, :] * z[0:2]) + 3
}
""")
def _(P, I, r, d):
    W, V, z = P["W"], P["V"], I["z"]
    return {"a": r.bmean(torch.tanh(I["x"] @ (F.softmax(W, 0) + V))),
            "p": r.once(0.1 * torch.logsumexp(W, 0).sum() + 0.1 * amax(V, 0).sum() + (z.mean(dim=0) * W[0]).sum()),
            "q": r.once((F.log_softmax(V, 0) * W).mean() + (W[1:3, :] * z[0:2]).sum() + 3)}


# -- losses ----------------------------------------------------------------------

# valid targets per sample: the first micro-batch at --gas 4 has none
CE_VALID = [0, 0, 5, 1, 2, 5, 3, 4]


def ce_variants(P, I, r, d):
    lg = I["x"] @ P["W"]
    B, T = d["B"], d["T"]
    return {"m": r.ce(lg, I["y1"], "y1"),
            "s": r.ce(lg, I["y1"], "y1", reduction="sum") / B,
            "n": r.ce(lg, I["y2"], "y2", ignore_index=3, reduction="none").sum() / (B * T),
            "nm": r.bmean(r.ce(lg, I["y1"], "y1", reduction="none")),
            "k": r.ce(lg, I["y2"], "y2", ignore_index=3),
            "v": r.ce(lg[:, 0], I["y3"], "y3"),
            "z": r.ce(lg, I["y4"], "y4", ignore_index=-1)}


case("ce_variants", [1, 2, 4],
     "cross_entropy: mean with ignore_index=-100 and uneven valid counts (a micro-batch "
     "with none at --gas 4), reduction=\"sum\", reduction=\"none\" then summed or averaged, "
     "ignore_index=3 (a class value) with mean and none, 2-D logits, and a window with no "
     "valid target (loss 0, no gradient)",
     """
model ce_variants {
  batch B = 8
  dim   T = 5
  dim   D = 4
  dim   V = 6

  input x  : f32[B, T, D]
  input y1 : i32[B, T]
  input y2 : i32[B, T]
  input y3 : i32[B]
  input y4 : i32[B, T]
  param W  : f32[D, V]

  logits = x @ W
  loss m  = cross_entropy(logits, y1)
  loss s  = cross_entropy(logits, y1, reduction="sum") / B
  loss n  = sum(cross_entropy(logits, y2, ignore_index=3, reduction="none")) / (B * T)
  loss nm = mean(cross_entropy(logits, y1, reduction="none"))
  loss k  = cross_entropy(logits, y2, ignore_index=3)
  loss v  = cross_entropy(logits[:, 0], y3)
  loss z  = cross_entropy(logits, y4, ignore_index=-1)
}
""", init={"W": normal(0.8)},
     data={"y1": targets(6, CE_VALID), "y2": targets(6, avoid_ignore=False), "y3": targets(6),
           "y4": lambda rng, shape, dt: np.full(shape, -1, dtype=np.int32)},
     zero_losses=["z"])(ce_variants)


@case("mse_variants", [1, 2, 4],
      "mse_loss mean (under a 0.5 coefficient) and sum, and a batch-independent mse_loss "
      "of a param against an unbatched input (once per window)",
      """
model mse_variants {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x : f32[B, D]
  input t : f32[B, H]
  input M : f32[D, H]
  param W : f32[D, H]

  z = x @ W
  loss a = 0.5 * mse_loss(z, t)
  loss b = mse_loss(tanh(z), t, reduction="sum") / B
  loss p = 0.1 * mse_loss(W, M)
  loss q = mse_loss(z, t, reduction="mean") * 3
}
""")
def _(P, I, r, d):
    z = I["x"] @ P["W"]
    t = I["t"]
    return {"a": 0.5 * r.mse(z, t),
            "b": r.mse(torch.tanh(z), t, "sum") / d["B"],
            "p": r.once(0.1 * F.mse_loss(P["W"], I["M"])),
            "q": r.mse(z, t) * 3}


@case("detach", [1, 2, 4],
      "detach: Wd is reached only through detach (its gradient is written as zeros), a "
      "detached-only loss (value, no gradient), and W used both detached and not",
      """
model detach {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x  : f32[B, D]
  param W  : f32[D, H]
  param Wd : f32[D, H]
  param Wm : f32[D, H]

  loss a = mean((x @ W - detach(x @ Wd)) ** 2)
  loss b = mean(tanh(x @ Wm) * detach(tanh(x @ Wm) + x @ W) + 1)
  loss c = 0.5 * mean(detach(x @ Wd) ** 2)
}
""")
def _(P, I, r, d):
    x = I["x"]
    return {"a": r.bmean((x @ P["W"] - detach(x @ P["Wd"])) ** 2),
            "b": r.bmean(torch.tanh(x @ P["Wm"]) * detach(torch.tanh(x @ P["Wm"]) + x @ P["W"]) + 1),
            "c": 0.5 * r.bmean(detach(x @ P["Wd"]) ** 2)}


@case("shared_losses", [1, 2, 4],
      "several losses over one shared sub-graph, constant coefficients (0.5 *, 2 *, / 2, "
      "unary minus), a batch mean, a penalty and a constant inside one loss, and a "
      "batch-independent penalty loss",
      """
model shared_losses {
  batch B = 8
  dim   D = 5
  dim   H = 4
  dim   C = 3

  input x  : f32[B, D]
  input y  : i32[B]
  input t  : f32[B, H]
  param W1 : f32[D, H]
  param W2 : f32[H, C]
  param g  : f32[H]

  h = tanh(x @ W1)
  loss ce  = cross_entropy(h @ W2, y)
  loss rec = 0.5 * mse_loss(h, t)
  loss mix = 2 * mean(h * g) + 0.01 * sum(W1 * W1) - mean(h) / 4 + 1
  loss avg = (mean(h * h) + mean(tanh(h @ W2))) / 2
  loss neg = -mean(log(sigmoid(h @ W2)))
  loss pen = 1e-2 * (sum(W2 * W2) + sum(abs(g)))
}
""", data={"y": targets(3)})
def _(P, I, r, d):
    h = torch.tanh(I["x"] @ P["W1"])
    W1, W2, g = P["W1"], P["W2"], P["g"]
    one = torch.tensor(1.0, dtype=h.dtype)
    return {"ce": r.ce(h @ W2, I["y"], "y"),
            "rec": 0.5 * r.mse(h, I["t"]),
            "mix": 2 * r.bmean(h * g) + r.once(0.01 * (W1 * W1).sum()) - r.bmean(h) / 4 + r.once(one),
            "avg": (r.bmean(h * h) + r.bmean(torch.tanh(h @ W2))) / 2,
            "neg": -r.bmean(torch.log(torch.sigmoid(h @ W2))),
            "pen": r.once(1e-2 * ((W2 * W2).sum() + g.abs().sum()))}


@case("unbatched_input", [1, 2, 4],
      "inputs without a batch axis are not split: a matrix, a scalar, a [N, H] input whose "
      "N equals B in size (but is not the batch dim), and an unbatched i32 index input; a "
      "loss of inputs only",
      """
model unbatched_input {
  batch B = 8
  dim   N = 8
  dim   D = 4
  dim   H = 3

  input x   : f32[B, D]
  input M   : f32[D, D]
  input s   : f32
  input z   : f32[N, H]
  input ids : i32[N]
  param W   : f32[D, H]
  param E   : f32[5, H]

  loss a = mean(tanh((x @ M) @ W) * s + 1)
  loss b = mean(z * embedding(ids, E)) + 1
  loss c = sum(tanh(x @ W) @ transpose(z, 0, 1)) / B
  loss k = mean(x * x) + sum(M) / 4 + 3         # no param at all: a value, no gradient
}
""", data={"ids": ints(0, 5), "s": normal(0.3, 1.0)})
def _(P, I, r, d):
    x, z = I["x"], I["z"]
    return {"a": r.bmean(torch.tanh((x @ I["M"]) @ P["W"]) * I["s"] + 1),
            "b": r.once((z * F.embedding(I["ids"], P["E"])).mean() + 1),
            "c": (torch.tanh(x @ P["W"]) @ z.t()).sum() / d["B"],
            "k": r.bmean(x * x) + r.once(I["M"].sum() / 4 + 3)}


@case("batch_linear", [1, 2, 4],
      "batch reductions used linearly: a batch mean over axis 0 only (also as axis=-2, and "
      "over [0, 1] of a 3-D tensor) times a param, a batch sum through a matmul with a param "
      "(all sums over samples)",
      """
model batch_linear {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x : f32[B, D]
  input t : f32[B, H]
  param W : f32[D, H]
  param c : f32[H]
  param V : f32[H, H]

  h = tanh(x @ W)
  loss a = sum(mean(h, axis=0) * c) + 1
  loss b = sum(sum(h * t, axis=0) @ V) / B + 1
  loss cm = sum(mean(reshape(h, [B, 1, H]), axis=[0, 1]) * c) + 1
  loss n = sum(mean(h, axis=-2) * c) + 1
}
""")
def _(P, I, r, d):
    h = torch.tanh(I["x"] @ P["W"])
    one = torch.tensor(1.0, dtype=h.dtype)
    return {"a": (r.bmean(h, 0) * P["c"]).sum() + r.once(one),
            "b": ((h * I["t"]).sum(dim=0) @ P["V"]).sum() / d["B"] + r.once(one),
            "cm": (r.bmean(h.reshape(h.shape[0], 1, -1), [0, 1]) * P["c"]).sum() + r.once(one),
            "n": (r.bmean(h, -2) * P["c"]).sum() + r.once(one)}


@case("batch_affine", [1, 2, 4],
      "an affine function of a batch mean below the loss's top level: "
      "mean(mean(h, axis=0) * c + 2) is mean(mean(h, axis=0) * c) + 2",
      """
model batch_affine {
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x : f32[B, D]
  param W : f32[D, H]
  param c : f32[H]

  h = tanh(x @ W)
  loss m = mean(mean(h, axis=0, keepdim=true) * c + 2)
}
""")
def _(P, I, r, d):
    h = torch.tanh(I["x"] @ P["W"])
    two = torch.tensor(2.0, dtype=h.dtype)
    return {"m": (r.bmean(h, 0, keepdim=True) * P["c"]).mean() + r.once(two)}


# tinygpt targets: valid per sample (the third sample has none)
GPT_VALID = [4, 1, 0, 3]


@case("tinygpt_block", [1, 2, 4],
      "a small GPT (examples/tinygpt.gdl in miniature): token and position embeddings, 2 "
      "pre-LN blocks over stacked params in a `for`, 2-head causal attention on 4-D tensors "
      "(reshape/permute, qkv slices), a gelu MLP, final layer_norm, logits tied to wte, "
      "cross_entropy with ignored targets",
      """
model tinygpt_block {
  batch B  = 4
  dim   T  = 4
  dim   C  = 8
  dim   NH = 2
  dim   HD = C / NH
  dim   L  = 2
  dim   V  = 11
  dim   F  = 2 * C

  input idx     : i32[B, T]
  input targets : i32[B, T]

  param wte    : f32[V, C]
  param wpe    : f32[T, C]
  param ln1_w  : f32[L, C]
  param ln1_b  : f32[L, C]
  param attn_w : f32[L, C, 3*C]
  param attn_b : f32[L, 3*C]
  param proj_w : f32[L, C, C]
  param proj_b : f32[L, C]
  param ln2_w  : f32[L, C]
  param ln2_b  : f32[L, C]
  param fc_w   : f32[L, C, F]
  param fc_b   : f32[L, F]
  param fcp_w  : f32[L, F, C]
  param fcp_b  : f32[L, C]
  param lnf_w  : f32[C]
  param lnf_b  : f32[C]

  fn heads(t) {
    return permute(reshape(t, [B, T, NH, HD]), [0, 2, 1, 3])
  }

  fn attention(x, l) {
    qkv = x @ attn_w[l] + attn_b[l]
    q = heads(qkv[..., 0:C])
    k = heads(qkv[..., C:2*C])
    v = heads(qkv[..., 2*C:3*C])
    att = q @ transpose(k, -2, -1) * rsqrt(HD)
    att = softmax(causal_mask(att), axis=-1)
    y = permute(att @ v, [0, 2, 1, 3])
    return reshape(y, [B, T, C]) @ proj_w[l] + proj_b[l]
  }

  fn mlp(x, l) {
    return gelu(x @ fc_w[l] + fc_b[l]) @ fcp_w[l] + fcp_b[l]
  }

  x = embedding(idx, wte) + wpe
  for l in 0..L {
    x = x + attention(layer_norm(x, ln1_w[l], ln1_b[l]), l)
    x = x + mlp(layer_norm(x, ln2_w[l], ln2_b[l]), l)
  }
  x = layer_norm(x, lnf_w, lnf_b)
  logits = x @ transpose(wte, 0, 1)
  loss ce = cross_entropy(logits, targets)
}
""", init={"wte": normal(0.5), "wpe": normal(0.3), "ln1_w": normal(0.1, 1.0), "ln2_w": normal(0.1, 1.0),
           "lnf_w": normal(0.1, 1.0), "ln1_b": normal(0.1), "ln2_b": normal(0.1), "lnf_b": normal(0.1),
           "attn_w": normal(0.4), "attn_b": normal(0.1), "proj_w": normal(0.3), "proj_b": normal(0.1),
           "fc_w": normal(0.4), "fc_b": normal(0.1), "fcp_w": normal(0.3), "fcp_b": normal(0.1)},
      data={"idx": ints(0, 11), "targets": targets(11, GPT_VALID)})
def _(P, I, r, d):
    T, C, NH, HD, L = d["T"], d["C"], d["NH"], d["HD"], d["L"]
    b = I["idx"].shape[0]

    def heads(t):
        return t.reshape(b, T, NH, HD).permute(0, 2, 1, 3)

    def attention(x, l):
        qkv = x @ P["attn_w"][l] + P["attn_b"][l]
        q, k, v = heads(qkv[..., 0:C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:3 * C])
        att = q @ k.transpose(-2, -1) * rsqrt_c(HD)
        att = F.softmax(causal_mask(att), dim=-1)
        y = (att @ v).permute(0, 2, 1, 3)
        return y.reshape(b, T, C) @ P["proj_w"][l] + P["proj_b"][l]

    def mlp(x, l):
        return gelu(x @ P["fc_w"][l] + P["fc_b"][l]) @ P["fcp_w"][l] + P["fcp_b"][l]

    x = F.embedding(I["idx"], P["wte"]) + P["wpe"]
    for l in range(L):
        x = x + attention(layer_norm(x, P["ln1_w"][l], P["ln1_b"][l]), l)
        x = x + mlp(layer_norm(x, P["ln2_w"][l], P["ln2_b"][l]), l)
    x = layer_norm(x, P["lnf_w"], P["lnf_b"])
    return {"ce": r.ce(x @ P["wte"].t(), I["targets"], "targets")}


# -- refusals: valid with --gas 1, refused with --gas > 1 on the `loss` line ----

REFUSE_HEAD = """
  batch B = 8
  dim   D = 4
  dim   H = 3

  input x  : f32[B, D]
  input y  : i32[B]
  input t  : f32[B, H]
  param W  : f32[D, H]
  param c  : f32[H]

  h = tanh(x @ W)
  loss ce = cross_entropy(h, y)
"""


def refusal(name, what, line, twin_expr, gas=(1, 2)):
    src = "\nmodel %s {%s  %s\n}\n" % (name, REFUSE_HEAD, line)
    lname = re.match(r"loss (\w+)", line).group(1)

    def twin(P, I, r, d):
        h = torch.tanh(I["x"] @ P["W"])
        return {"ce": r.ce(h, I["y"], "y"), lname: twin_expr(h, P, I)}
    case(name, list(gas), what, src, data={"y": targets(3)}, init={"c": normal(0.5, 1.0)},
         refuse=lname)(twin)


refusal("refuse_max_batch", "max over the batch axis",
        "loss m = mean(max(h, axis=0) * c)",
        lambda h, P, I: (amax(h, 0) * P["c"]).mean())
refusal("refuse_max_all", "max over all axes (the batch axis among them)",
        "loss m = max(h * c) + 1",
        lambda h, P, I: amax(h * P["c"]) + 1, gas=(1, 4))
refusal("refuse_mean_sq", "a non-linear function of a batch mean: mean(x) ** 2",
        "loss v = mean(h * c) ** 2",
        lambda h, P, I: (h * P["c"]).mean() ** 2)
refusal("refuse_centre", "batch-norm style centring h - mean(h, axis=0), squared",
        "loss cen = mean((h - mean(h, axis=0)) ** 2 * c)",
        lambda h, P, I: ((h - h.mean(dim=0)) ** 2 * P["c"]).mean(), gas=(1, 2, 4))
refusal("refuse_softmax_batch", "softmax over the batch axis",
        "loss s = sum(softmax(h, axis=0) * t)",
        lambda h, P, I: (F.softmax(h, dim=0) * I["t"]).sum())
refusal("refuse_lse_batch", "logsumexp over the batch axis",
        "loss l = mean(logsumexp(h * c, 0))",
        lambda h, P, I: torch.logsumexp(h * P["c"], 0).mean())
refusal("refuse_sum_sq", "a non-linear function of a batch sum written out: (sum(..) / B) ** 2",
        "loss v = (sum(h * c) / B) ** 2",
        lambda h, P, I: ((h * P["c"]).sum() / 8) ** 2)
refusal("refuse_ratio", "a ratio of two batch means",
        "loss q = mean(h * c) / mean(h * h)",
        lambda h, P, I: (h * P["c"]).mean() / (h * h).mean())
refusal("refuse_softmax_negaxis", "softmax over the batch axis named by a negative axis (-2 of [B, H])",
        "loss s = sum(softmax(h, axis=-2) * t)",
        lambda h, P, I: (F.softmax(h, dim=-2) * I["t"]).sum())
refusal("refuse_softmax_permuted", "softmax over the batch axis after a transpose moved it to axis 1",
        "loss s = sum(softmax(transpose(h, 0, 1), axis=1) * transpose(t, 0, 1))",
        lambda h, P, I: (F.softmax(h.t(), dim=1) * I["t"].t()).sum())
refusal("refuse_slice_batch", "slicing the batch axis",
        "loss f = mean(h[0:2, :] ** 2 * c)",
        lambda h, P, I: (h[0:2, :] ** 2 * P["c"]).mean())
refusal("refuse_index_batch", "indexing the batch axis with an integer",
        "loss f = sum(h[-1] * c)",
        lambda h, P, I: (h[-1] * P["c"]).sum())


# -- errors: `$` marks the token the first diagnostic must point at -------------

ERR_HEAD = """
  batch B = 8
  dim   D = 5
  dim   H = 3

  input x : f32[B, D]
  input y : i32[B]
"""

error_case("err_matmul", "matmul inner dimensions differ: f32[8,5] @ f32[4,3], at the `@`",
           """
model err_matmul {%s  param W : f32[4, H]

  h = tanh(x $@ W)
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD, shapes=[r"(8|B)\s*[,x\u00d7]\s*5", r"4\s*[,x\u00d7]\s*3"])

error_case("err_batched_matmul", "batched matmul whose batch dims do not broadcast: "
           "f32[8,3,4] @ f32[5,4,2], at the `@`",
           """
model err_batched_matmul {
  batch B = 8
  dim   T = 3

  input x : f32[B, T, 4]
  param W : f32[5, 4, 2]

  loss s = mean(x $@ W)
}
""", shapes=[r"(8|B)\s*[,x\u00d7]\s*(3|T)\s*[,x\u00d7]\s*4", r"5\s*[,x\u00d7]\s*4\s*[,x\u00d7]\s*2"])

error_case("err_fn_body", "a broadcast error inside an inlined fn points into its body "
           "(f32[8,3] * f32[8,4] at the `*`), with a note at the call",
           """
model err_fn_body {%s  param Wa : f32[D, H]
  param Wb : f32[D, 4]

  fn gate(a, b) {
    return a $* sigmoid(b)
  }

  h = ^gate(x @ Wa, x @ Wb)
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD, shapes=[r"(8|B)\s*[,x\u00d7]\s*3", r"(8|B)\s*[,x\u00d7]\s*4"])

error_case("err_for_body", "a shape error in a `for` body is reported once, not per iteration",
           """
model err_for_body {%s  dim   L = 3
  param W : f32[L, H, H]
  param V : f32[D, H]

  h = x @ V
  for l in 0..L {
    h = tanh(h @ W[l]) $- x
  }
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD, shapes=[r"(8|B)\s*[,x\u00d7]\s*3", r"(8|B)\s*[,x\u00d7]\s*5"], nerrors=1)

error_case("err_reshape", "reshape to a different element count: f32[8,6] to [8,7], at `reshape`",
           """
model err_reshape {%s  param W : f32[D, 6]

  g = $reshape(x @ W, [B, 7])
  loss s = mean(g)
}
""" % ERR_HEAD, shapes=[r"(8|B)\s*[,x\u00d7]\s*6", r"(8|B)\s*[,x\u00d7]\s*7"])

error_case("err_concat", "concat of f32[8,3] and f32[4,3] along axis 1, at `concat`",
           """
model err_concat {%s  param W : f32[D, H]
  param P : f32[4, H]

  g = $concat([x @ W, P], axis=1)
  loss s = mean(g)
}
""" % ERR_HEAD, shapes=[r"(8|B)\s*[,x\u00d7]\s*3", r"4\s*[,x\u00d7]\s*3"])

error_case("err_ce_target", "cross_entropy with logits f32[8,2,3] and targets i32[8], at "
           "`cross_entropy`",
           """
model err_ce_target {%s  param W : f32[D, 2, H]

  logits = reshape(x @ reshape(W, [D, 2 * H]), [B, 2, H])
  loss ce = $cross_entropy(logits, y)
}
""" % ERR_HEAD, shapes=[r"(8|B)\s*[,x\u00d7]\s*2\s*[,x\u00d7]\s*3"])

error_case("err_layer_norm", "layer_norm weight f32[4] for rows of 3, at `layer_norm`",
           """
model err_layer_norm {%s  param W : f32[D, H]
  param g : f32[4]
  param b : f32[H]

  h = $layer_norm(x @ W, g, b)
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD, shapes=[r"\b4\b", r"(8|B)\s*[,x\u00d7]\s*3"])

error_case("err_unknown_name", "an unknown name, at its first character",
           """
model err_unknown_name {%s  param W : f32[D, H]

  h = tanh(x @ $Wz)
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD)

error_case("err_unknown_dim", "an unknown dim in a param type, at its first character",
           """
model err_unknown_dim {%s  param W : f32[D, $Q]

  loss ce = cross_entropy(x @ W, y)
}
""" % ERR_HEAD)

error_case("err_unknown_fn", "a call to an unknown function, at its name",
           """
model err_unknown_fn {%s  param W : f32[D, H]

  h = $tanhh(x @ W)
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD)

error_case("err_arity", "a call with too few arguments, at the call's name",
           """
model err_arity {%s  param W : f32[D, H]

  h = $maximum(x @ W)
  loss ce = cross_entropy(h, y)
}
""" % ERR_HEAD)


# ----------------------------------------------------------------------------
# Reading declarations out of a .gdl source (top level only; one per line)

DECL_RE = re.compile(r"^\s*(batch|dim)\s+(\w+)\s*=\s*([^#\n]+)", re.M)
TENSOR_RE = re.compile(r"^\s*(input|param)\s+(\w+)\s*:\s*(f32|f64|i32)(\[[^\]]*\])?", re.M)
LOSS_RE = re.compile(r"^\s*loss\s+(\w+)\s*=", re.M)
NP_DT = {"f32": np.float32, "f64": np.float64, "i32": np.int32}


def declarations(src):
    src = src.replace(";", "\n")
    dims, batch = {}, None
    for kind, name, expr in DECL_RE.findall(src):
        v = eval(expr, {"__builtins__": {}}, dict(dims))
        assert v == int(v), (name, expr)
        dims[name] = int(v)
        if kind == "batch":
            batch = name
    tensors = []
    for kind, name, dt, shape in TENSOR_RE.findall(src):
        parts = [p.strip() for p in shape[1:-1].split(",")] if shape else []
        dimv = tuple(int(eval(p, {"__builtins__": {}}, dict(dims))) for p in parts)
        batched = kind == "input" and bool(parts) and parts[0] == batch
        tensors.append(dict(kind=kind, name=name, dtype=NP_DT[dt], shape=dimv, batched=batched))
    return dims, batch, tensors, LOSS_RE.findall(src)


def seed_of(name):
    return zlib.crc32(name.encode())


def make_data(c, src):
    dims, batch, tensors, _ = declarations(src)
    rng = np.random.default_rng(seed_of(c["name"]))
    P, I = {}, {}
    for t in tensors:
        gen = (c["init"] if t["kind"] == "param" else c["data"]).get(t["name"])
        if gen is None:
            if t["dtype"] == np.int32:
                raise ValueError("%s: integer input %s needs a generator" % (c["name"], t["name"]))
            gen = normal(0.5) if t["kind"] == "param" else normal(1.0)
        a = gen(rng, t["shape"], t["dtype"])
        assert a.shape == t["shape"] and a.dtype == t["dtype"], (c["name"], t["name"], a.shape, a.dtype)
        (P if t["kind"] == "param" else I)[t["name"]] = a
    for dst, srcname in c.get("tie", {}).items():
        P[dst] = P[srcname].copy()
    batched = {t["name"] for t in tensors if t["batched"]}
    return dims, P, I, batched


# ----------------------------------------------------------------------------
# Evaluating twins

def to_torch(In, dtype):
    return {n: torch.tensor(a, dtype=dtype) if a.dtype.kind == "f" else torch.tensor(a.astype(np.int64))
            for n, a in In.items()}


def evaluate(twin, dims, Pn, In, reducer, dtype=torch.float64):
    P = {n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in Pn.items()}
    L = twin(P, to_torch(In, dtype), reducer, dims)
    total = sum(L.values())
    total.backward()
    G = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double() for n, p in P.items()}
    return {n: v.item() for n, v in L.items()}, total.item(), G


def window_ints(In):
    return {n: torch.tensor(a.astype(np.int64)) for n, a in In.items() if a.dtype.kind == "i"}


def reference(c, dims, Pn, In):
    return evaluate(c["twin"], dims, Pn, In, FullBatch(window_ints(In)))


def accumulate(c, dims, Pn, In, batched, K, mode):
    """Sum over K micro-batches: mode 'window' is DESIGN.md section 3, the others emulate bugs."""
    b = dims["B"] // K
    win = window_ints(In)
    Ls, Gs = {}, {}
    for k in range(K):
        part = {n: (a[k * b:(k + 1) * b] if n in batched else a) for n, a in In.items()}
        r, w = {"window": (WindowPart(win, K), 1.0), "penalty-xK": (PenaltyEveryPart(win, K), 1.0),
                "mb-mean": (MicroMeans(win), 1.0 / K), "mb-sum": (MicroMeans(win), 1.0)}[mode]
        L, _, G = evaluate(c["twin"], dims, Pn, part, r)
        for n, v in L.items():
            Ls[n] = Ls.get(n, 0.0) + w * v
        for n, g in G.items():
            Gs[n] = Gs.get(n, 0.0) + w * g
    return Ls, Gs


def rel(a, b):
    num = torch.linalg.norm((a - b).reshape(-1)).item()
    den = torch.linalg.norm(b.reshape(-1)).item()
    return num / den if den > 0 else num


def worst(L, G, L0, G0):
    w = 0.0
    for n in L0:
        e = abs(L[n] - L0[n]) / abs(L0[n]) if L0[n] != 0 else abs(L[n])
        w = max(w, float("inf") if math.isnan(e) else e)
    for n in G0:
        e = rel(G[n], G0[n])
        w = max(w, float("inf") if math.isnan(e) else e)
    return w


def fd_worst(c, dims, Pn, In, G0, rng, ncoord=4, h=1e-6):
    """Central differences in float64 on random coordinates of every param."""
    I = to_torch(In, torch.float64)
    P0 = {n: torch.tensor(a, dtype=torch.float64) for n, a in Pn.items()}
    red = FullBatch(window_ints(In))

    def f(P):
        detach.i = 0
        with torch.no_grad():
            return sum(c["twin"](P, I, red, dims).values()).item()

    detach.mode, detach.saved = "record", []
    f(P0)
    detach.mode = "replay"

    w = 0.0
    for n, p in P0.items():
        if n in c["fd_skip"]:
            continue
        for i in rng.choice(p.numel(), size=min(ncoord, p.numel()), replace=False):
            Pp = {k: v.clone() for k, v in P0.items()}
            Pm = {k: v.clone() for k, v in P0.items()}
            Pp[n].view(-1)[i] += h
            Pm[n].view(-1)[i] -= h
            fd = (f(Pp) - f(Pm)) / (2 * h)
            ag = G0[n].reshape(-1)[i].item()
            w = max(w, abs(fd - ag) / max(1e-3, abs(ag)))
    detach.mode = None
    return w


# ----------------------------------------------------------------------------
# Writing

def path(name, suffix):
    return os.path.join(CASES_DIR, name + suffix)


def header(name, what, extra=()):
    words, lines, cur = ("%s: %s." % (name, what)).split(), [], "#"
    for w in words:
        if len(cur) + 1 + len(w) > 78:
            lines.append(cur)
            cur = "#"
        cur += " " + w
    lines.append(cur)
    return "\n".join(lines + list(extra))


def strip_markers(text):
    """Remove the `$` (error) and `^` (note) markers; their (line, col) in the result."""
    out, marks, line, col = [], {"$": [], "^": []}, 1, 1
    for ch in text:
        if ch in marks:
            marks[ch].append((line, col))
            continue
        out.append(ch)
        line, col = (line + 1, 1) if ch == "\n" else (line, col + 1)
    return "".join(out), marks


def final_source(c):
    """The .gdl text as written; for error cases also the (line, col) of `$`
    and the list of `^` (expected notes)."""
    body = c["src"].lstrip("\n")
    if c in ERRORS:
        hdr = header(c["name"], c["what"], ["# expect-error: %d:%d"])
        text, marks = strip_markers(hdr + "\n" + body)
        assert len(marks["$"]) == 1, c["name"]
        line, col = marks["$"][0]
        return (hdr % (line, col)) + "\n" + strip_markers(body)[0], (line, col), marks["^"]
    extra = []
    if c.get("refuse"):
        extra = ["# With --gas > 1 this model must be refused (DESIGN.md section 3, rule 4) on the",
                 "# line of `loss %s`; with --gas 1 it runs." % c["refuse"]]
    return header(c["name"], c["what"], extra) + "\n" + body, None, []


def line_of_loss(src, lname):
    for i, l in enumerate(src.split("\n"), 1):
        if re.match(r"\s*loss\s+%s\s*=" % lname, l):
            return i
    raise KeyError(lname)


def tensors_in_order(src, arrays, kind):
    _, _, tensors, _ = declarations(src)
    return [(t["name"], arrays[t["name"]]) for t in tensors if t["kind"] == kind]


def readme():
    out = ["# torchref: gradc against PyTorch float64", "",
           "Generated by `gen.py` (do not edit; edit gen.py and run `/usr/bin/python3 tests/torchref/gen.py`).",
           "Every case is a `.gdl` model in `cases/` with a hand-written PyTorch twin in `gen.py`; the",
           "references are the twin's full-batch float64 losses and gradients.  `tests/unit/test_torchref.c`",
           "runs every manifest entry through the library (no Python needed);",
           "`python3 ../shared/conformance/check.py build/gradc --manifest tests/torchref/cases/manifest.json`",
           "runs the same corpus through the command line.", "",
           "| case | --gas | checks |", "| --- | --- | --- |"]
    for c in CASES + REFUSALS:
        what = c["what"] + (" (refused with --gas > 1)" if c["refuse"] else "")
        out.append("| `%s` | %s | %s |" % (c["name"], ", ".join(map(str, c["gas"])), what.replace("|", "\\|")))
    for c in ERRORS:
        out.append("| `%s` | error | %s |" % (c["name"], c["what"].replace("|", "\\|")))
    return "\n".join(out) + "\n"


def generate():
    os.makedirs(CASES_DIR, exist_ok=True)
    with open(os.path.join(HERE, "README.md"), "w") as f:
        f.write(readme())
    manifest = {"version": 1,
                "description": "gradc torch-reference corpus; generated by tests/torchref/gen.py",
                "tolerance": {"loss_rel": 1e-4, "grad_rel": 1e-4, "zero_grad_abs": 1e-6},
                "cases": []}
    for c in CASES + REFUSALS:
        name = c["name"]
        src, _, _ = final_source(c)
        with open(path(name, ".gdl"), "w") as f:
            f.write(src)
        dims, Pn, In, _ = make_data(c, src)
        st_write(path(name, ".params.safetensors"), tensors_in_order(src, Pn, "param"))
        st_write(path(name, ".inputs.safetensors"),
                 [(n, a.astype(np.int64) if c["i64"] and a.dtype.kind == "i" else a)
                  for n, a in tensors_in_order(src, In, "input")])
        L, total, G = reference(c, dims, Pn, In)
        st_write(path(name, ".ref.safetensors"), [(n, G[n].numpy()) for n, _ in
                                                  tensors_in_order(src, Pn, "param")])
        ref = {"case": name, "losses": L, "loss_order": list(L), "total": total,
               "grad_norms": {n: torch.linalg.norm(g.reshape(-1)).item() for n, g in G.items()},
               "note": "full-batch values in float64 from the stored params/inputs (gen.py)"}
        with open(path(name, ".ref.json"), "w") as f:
            json.dump(ref, f, indent=2)
            f.write("\n")
        e = {"name": name, "kind": "run", "what": c["what"], "file": name + ".gdl",
             "params": name + ".params.safetensors", "inputs": name + ".inputs.safetensors",
             "ref": name + ".ref.safetensors", "ref_json": name + ".ref.json",
             "gas": c["gas"], "refuse_gas_gt1": bool(c["refuse"])}
        if c["refuse"]:
            e["refuse_line"] = line_of_loss(src, c["refuse"])
        if c["tol"]:
            e["tol"] = c["tol"]
        manifest["cases"].append(e)
        print("wrote %-20s total %.9g" % (name, total))
    for c in ERRORS:
        name = c["name"]
        src, (line, col), notes = final_source(c)
        with open(path(name, ".gdl"), "w") as f:
            f.write(src)
        c2 = dict(c, init={}, data={"y": targets(3)})
        try:
            _, Pn, In, _ = make_data(c2, src)
        except Exception:  # a type that does not evaluate (unknown dim): no data needed beyond x, y
            Pn, In = {}, {}
        st_write(path(name, ".params.safetensors"), list(Pn.items()))
        st_write(path(name, ".inputs.safetensors"), list(In.items()))
        e = {"name": name, "kind": "error", "what": c["what"], "file": name + ".gdl",
             "params": name + ".params.safetensors", "inputs": name + ".inputs.safetensors",
             "expected_line": line, "expected_col": col, "commands": ["check", "run"],
             "expected_shapes": c["shapes"]}
        if c["nerrors"]:
            e["expected_nerrors"] = c["nerrors"]
        if notes:
            e["expected_notes"] = [list(n) for n in notes]
        manifest["cases"].append(e)
        print("wrote %-20s expect error at %d:%d" % (name, line, col))
    with open(path("manifest", ".json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print("wrote manifest.json with %d cases" % len(manifest["cases"]))


# ----------------------------------------------------------------------------
# Checking

def check(only):
    failures = []
    rng = np.random.default_rng(7)
    manifest = json.load(open(path("manifest", ".json")))
    entries = {e["name"]: e for e in manifest["cases"]}
    print()
    print("fd: worst |finite difference - autograd| / max(|autograd|, 1e-3), float64")
    print("window: worst relative difference of K micro-batches (section 3 rule) from the full batch")
    print("f32: worst relative error of a float32 torch run; bugs: emulated bugs the case catches at max K")
    print("%-20s %8s %3s %8s %8s  %s" % ("case", "fd", "K", "window", "f32", "bugs"))
    for c in CASES + REFUSALS:
        name = c["name"]
        if only and name not in only:
            continue
        src = open(path(name, ".gdl")).read()
        if src != final_source(c)[0]:
            failures.append("%s: .gdl differs from gen.py" % name)
        dims, P2, I2, batched = make_data(c, src)
        Pn, In = st_read(path(name, ".params.safetensors")), st_read(path(name, ".inputs.safetensors"))
        for new, old in ((P2, Pn), (I2, In)):
            if set(new) != set(old) or any(not np.array_equal(new[k], old[k]) for k in new):
                failures.append("%s: stored params/inputs differ from a regeneration" % name)
            if any(old[k].dtype != (np.int64 if c["i64"] and new[k].dtype.kind == "i" else new[k].dtype)
                   for k in new):
                failures.append("%s: stored params/inputs have other dtypes than declared" % name)
        L0, t0, G0 = reference(c, dims, Pn, In)
        _, _, _, gdl_losses = declarations(src)
        if list(L0) != gdl_losses:
            failures.append("%s: twin losses %s, .gdl losses %s" % (name, list(L0), gdl_losses))
        # A loss statement binds its name too; keep loss names apart from declarations.
        ddims, _, dtensors, _ = declarations(src)
        clash = set(gdl_losses) & (set(ddims) | {t["name"] for t in dtensors})
        if clash:
            failures.append("%s: loss names %s are also declared names" % (name, sorted(clash)))
        stored = st_read(path(name, ".ref.safetensors"))
        if any(not np.array_equal(stored[n], G0[n].numpy()) for n in G0):
            failures.append("%s: stored gradients differ from a recomputation" % name)
        ref = json.load(open(path(name, ".ref.json")))
        if ref["losses"] != L0 or ref["total"] != t0:
            failures.append("%s: ref.json differs from a recomputation" % name)
        for n, v in L0.items():
            if n in c["zero_losses"]:
                if v != 0.0:
                    failures.append("%s: loss %s should be exactly 0, is %g" % (name, n, v))
            elif not abs(v) > 1e-3:
                failures.append("%s: loss %s = %g is too close to 0 for a relative check" % (name, n, v))
        for n, g in G0.items():
            if torch.isnan(g).any():
                failures.append("%s: gradient %s has NaN" % (name, n))
        for chk in c["checks"]:
            msg = chk(G0)
            if msg:
                failures.append("%s: %s" % (name, msg))
        fd = fd_worst(c, dims, Pn, In, G0, rng)
        if fd > 1e-5:
            failures.append("%s: finite differences disagree (%.2e)" % (name, fd))
        f32 = 0.0
        if all(a.dtype == np.float32 for a in Pn.values()):
            P32 = {n: a.astype(np.float32) for n, a in Pn.items()}
            I32 = {n: (a.astype(np.float32) if a.dtype.kind == "f" else a) for n, a in In.items()}
            Lf, _, Gf = evaluate(c["twin"], dims, P32, I32, FullBatch(window_ints(In)), dtype=torch.float32)
            f32 = worst(Lf, Gf, L0, G0)
            if f32 > 2e-5:
                failures.append("%s: float32 torch is %.2e from the reference" % (name, f32))
        for label, m in c["mutants"].items():
            Lm, _, Gm = evaluate(m, dims, Pn, In, FullBatch(window_ints(In)))
            dm = worst(Lm, Gm, L0, G0)
            if not dm > 1e-3:
                failures.append("%s: mutant '%s' is only %.1e from the reference" % (name, label, dm))
            print("%-20s mutant %-22s differs by %.1e" % (name, label, dm))
        if c["refuse"]:
            want = line_of_loss(src, c["refuse"])
            if entries[name].get("refuse_line") != want:
                failures.append("%s: manifest refuse_line differs" % name)
        if c["tol"] and entries[name].get("tol") != c["tol"]:
            failures.append("%s: manifest tol differs" % name)
        if entries[name]["gas"] != c["gas"]:
            failures.append("%s: manifest gas differs" % name)
        B = dims.get("B")
        for K in c["gas"]:
            if B % K:
                failures.append("%s: B=%d not divisible by %d" % (name, B, K))
                continue
            if K == 1:
                if len(c["gas"]) == 1:
                    print("%-20s %8.1e %3d %8s %8.1e" % (name, fd, K, "-", f32))
                continue
            Lw, Gw = accumulate(c, dims, Pn, In, batched, K, "window")
            w = worst(Lw, Gw, L0, G0)
            if c["refuse"]:
                if w < 1e-3:
                    failures.append("%s: the window rule reproduces the full batch at K=%d, so it "
                                    "need not be refused" % (name, K))
                note = "not a sum over samples (%.1e off): --gas %d must refuse" % (w, K)
            else:
                if w > 1e-12:
                    failures.append("%s: window rule is %.2e off the full batch at K=%d" % (name, w, K))
                caught = []
                for mode in ("mb-mean", "mb-sum", "penalty-xK"):
                    Lb, Gb = accumulate(c, dims, Pn, In, batched, K, mode)
                    db = worst(Lb, Gb, L0, G0)
                    if not db < 1e-3:
                        caught.append("%s %.0e" % (mode, db))
                note = ", ".join(caught) or "-"
            print("%-20s %8.1e %3d %8.1e %8.1e  %s" % (name, fd, K, w, f32, note))
    for c in ERRORS:
        name = c["name"]
        if only and name not in only:
            continue
        src, (line, col), notes = final_source(c)
        if open(path(name, ".gdl")).read() != src:
            failures.append("%s: .gdl differs from gen.py" % name)
        e = entries[name]
        if (e["expected_line"], e["expected_col"]) != (line, col):
            failures.append("%s: manifest location differs" % name)
        if e.get("expected_notes", []) != [list(n) for n in notes]:
            failures.append("%s: manifest notes differ" % name)
        text = src.split("\n")[line - 1]
        print("%-20s error at %d:%d: %s" % (name, line, col, text.strip()))
        if text[col - 1] == " ":
            failures.append("%s: the location is a blank" % name)
    if not only and open(os.path.join(HERE, "README.md")).read() != readme():
        failures.append("README.md differs from gen.py")
    total = sum(os.path.getsize(os.path.join(CASES_DIR, f)) for f in os.listdir(CASES_DIR))
    print("\ncorpus size: %d bytes" % total)
    if total > 2_000_000:
        failures.append("corpus is %d bytes (limit 2 MB)" % total)
    if failures:
        print("\nCHECK FAILURES:")
        for f in failures:
            print("  " + f)
        return 1
    print("\nall checks passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only run the checks")
    ap.add_argument("--cases", help="comma-separated case names to check")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if not a.check:
        generate()
    return check(set(a.cases.split(",")) if a.cases else None)


if __name__ == "__main__":
    sys.exit(main())

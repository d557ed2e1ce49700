#!/usr/bin/python3
"""PyTorch twins of examples/tinygpt.gdl, examples/mlp.gdl and
bench/models/mlp2.gdl, timed the way
`gradc bench` times gradc (DESIGN.md section 5).

Same math, same shapes and the same init scale as the .gdl models: stacked
per-layer params indexed by layer as in tinygpt.gdl, layer_norm eps 1e-5,
GELU with the tanh approximation, cross_entropy with the mean.  Eager
float32 on the CPU, torch.set_num_threads(N), and OpenBLAS (which torch's
GEMMs go through on Debian, as gradc's do) limited to N threads too.

Prints one JSON object:
  step_ms_median, step_ms_min  forward+backward of one batch, grads set to
                               None between steps, after warm-up
  gemm_floor_ms                the step's GEMMs (mm/bmm/addmm/... as the
                               step dispatches them, with their shapes and
                               transposes) run through torch.matmul alone
  peak_rss_bytes               the process's peak RSS after the steps
                               (ru_maxrss), and base_rss_bytes: after
                               building the model, before the first step
  aten_ops                     every aten:: op torch.profiler records in
                               one step (composites and calls inside
                               kernels included)
  ops, kernels                 operators autograd dispatches in one step
                               (forward and backward), and those of them
                               that do work (views and metadata left
                               out): the kernels a step launches
  gemms                        GEMM operators per step

With --compile the step runs through torch.compile and the object has
compile_ms (the cold first call) instead of the op counts and the floor.

With --autocast bf16 the forward runs under torch.autocast (CPU, bfloat16).

Usage: torch_models.py tinygpt|mlp|mlp2 [-D NAME=V]... [--threads N] [--steps N]
       [--warmup N] [--compile] [--autocast bf16]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=["tinygpt", "mlp", "mlp2"])
    ap.add_argument("-D", dest="defs", action="append", default=[], metavar="NAME=V")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true",
                    help="run the step through torch.compile(model); compile_ms is the cold first call "
                         "(tracing, Inductor's code generation and one step), and the op counts and the "
                         "GEMM floor are left out")
    ap.add_argument("--autocast", choices=["bf16"],
                    help="run the forward under torch.autocast('cpu', dtype=torch.bfloat16), as PyTorch's "
                         "mixed precision does on the CPU (params and their grads stay f32): the peer of "
                         "`gradc bench --precision bf16`")
    ap.add_argument("--loss-from", nargs=2, metavar=("PARAMS", "INPUTS"),
                    help="print the loss on these safetensors files (written by gradc init and gradc data "
                         "random) instead of timing: the twin against `gradc run`")
    return ap.parse_args()


args = parse()
# Before torch loads OpenBLAS: its thread count is read at start-up, and
# torch.set_num_threads does not reach it in Debian's build.
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
os.environ["OMP_NUM_THREADS"] = str(args.threads)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)


def dims(defaults):
    d = dict(defaults)
    for s in args.defs:
        k, v = s.split("=")
        if k not in d:
            sys.exit(f"torch_models.py: {args.model} has no dim {k}")
        d[k] = int(v)
    return d


def normal(shape, std):
    return torch.nn.Parameter(torch.randn(*shape) * std)


def zeros(shape):
    return torch.nn.Parameter(torch.zeros(*shape))


def ones(shape):
    return torch.nn.Parameter(torch.ones(*shape))


class TinyGPT(torch.nn.Module):
    """examples/tinygpt.gdl: pre-LN GPT-2 blocks, logits tied to wte."""

    def __init__(self, d):
        super().__init__()
        self.d = d
        B, T, C, NH, L, V = d["B"], d["T"], d["C"], d["NH"], d["L"], d["V"]
        Fw = 4 * C
        self.wte = normal((V, C), 0.02)
        self.wpe = normal((T, C), 0.01)
        self.ln1_w, self.ln1_b = ones((L, C)), zeros((L, C))
        self.attn_w, self.attn_b = normal((L, C, 3 * C), 0.02), zeros((L, 3 * C))
        self.proj_w, self.proj_b = normal((L, C, C), 0.01), zeros((L, C))
        self.ln2_w, self.ln2_b = ones((L, C)), zeros((L, C))
        self.fc_w, self.fc_b = normal((L, C, Fw), 0.02), zeros((L, Fw))
        self.fcp_w, self.fcp_b = normal((L, Fw, C), 0.01), zeros((L, C))
        self.lnf_w, self.lnf_b = ones((C,)), zeros((C,))
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1))

    def heads(self, t):
        B, T, NH, C = self.d["B"], self.d["T"], self.d["NH"], self.d["C"]
        return t.reshape(B, T, NH, C // NH).permute(0, 2, 1, 3)

    def attention(self, x, l):
        B, T, C, NH = self.d["B"], self.d["T"], self.d["C"], self.d["NH"]
        qkv = x @ self.attn_w[l] + self.attn_b[l]
        q = self.heads(qkv[..., 0:C])
        k = self.heads(qkv[..., C:2 * C])
        v = self.heads(qkv[..., 2 * C:3 * C])
        att = q @ k.transpose(-2, -1) * (C // NH) ** -0.5
        att = torch.softmax(att.masked_fill(self.mask, float("-inf")), dim=-1)
        y = (att @ v).permute(0, 2, 1, 3)
        return y.reshape(B, T, C) @ self.proj_w[l] + self.proj_b[l]

    def mlp(self, x, l):
        h = F.gelu(x @ self.fc_w[l] + self.fc_b[l], approximate="tanh")
        return h @ self.fcp_w[l] + self.fcp_b[l]

    def forward(self, idx, targets):
        C = self.d["C"]
        x = F.embedding(idx, self.wte) + self.wpe
        for l in range(self.d["L"]):
            x = x + self.attention(F.layer_norm(x, (C,), self.ln1_w[l], self.ln1_b[l], 1e-5), l)
            x = x + self.mlp(F.layer_norm(x, (C,), self.ln2_w[l], self.ln2_b[l], 1e-5), l)
        x = F.layer_norm(x, (C,), self.lnf_w, self.lnf_b, 1e-5)
        logits = x @ self.wte.transpose(0, 1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def batch(self):
        B, T, V = self.d["B"], self.d["T"], self.d["V"]
        return torch.randint(0, V, (B, T), dtype=torch.long), torch.randint(0, V, (B, T), dtype=torch.long)


class MLP(torch.nn.Module):
    """examples/mlp.gdl: one hidden layer of width H, an L2 term on W1."""

    def __init__(self, d):
        super().__init__()
        self.d = d
        D, H = d["D"], d["H"]
        self.W1 = normal((D, H), 0.02)
        self.b1 = zeros((H,))
        self.W2 = normal((H, 10), 0.02)

    def forward(self, x, y):
        h = torch.relu(x @ self.W1 + self.b1)
        logits = h @ self.W2
        return F.cross_entropy(logits, y) + 1e-4 * torch.sum(self.W1 * self.W1)

    def batch(self):
        B, D = self.d["B"], self.d["D"]
        return torch.randn(B, D), torch.randint(0, 10, (B,), dtype=torch.long)


class MLP2(torch.nn.Module):
    """bench/models/mlp2.gdl: two hidden layers of width H, an L2 term on W1."""

    def __init__(self, d):
        super().__init__()
        self.d = d
        D, H = d["D"], d["H"]
        self.W1 = normal((D, H), 0.02)
        self.b1 = zeros((H,))
        self.W2 = normal((H, H), 0.02)
        self.b2 = zeros((H,))
        self.W3 = normal((H, 10), 0.02)

    def forward(self, x, y):
        h1 = torch.relu(x @ self.W1 + self.b1)
        h2 = torch.relu(h1 @ self.W2 + self.b2)
        logits = h2 @ self.W3
        return F.cross_entropy(logits, y) + 1e-4 * torch.sum(self.W1 * self.W1)

    def batch(self):
        B, D = self.d["B"], self.d["D"]
        return torch.randn(B, D), torch.randint(0, 10, (B,), dtype=torch.long)


if args.model == "tinygpt":
    model = TinyGPT(dims({"B": 8, "T": 32, "C": 64, "NH": 4, "L": 2, "V": 96}))
elif args.model == "mlp2":
    model = MLP2(dims({"B": 256, "D": 784, "H": 1024}))
else:
    model = MLP(dims({"B": 64, "D": 784, "H": 256}))
inputs = model.batch()


def read_safetensors(path):
    """name -> tensor (F32, F64, I32, I64) from a safetensors file."""
    import struct
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    kinds = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64}
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + end])
        out[name] = torch.frombuffer(buf, dtype=kinds[e["dtype"]]).reshape(e["shape"]) if buf else \
            torch.zeros(e["shape"], dtype=kinds[e["dtype"]])
    return out


if args.loss_from:
    params, batch = read_safetensors(args.loss_from[0]), read_safetensors(args.loss_from[1])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    names = ["idx", "targets"] if args.model == "tinygpt" else ["x", "y"]
    inputs = [batch[n].long() if not batch[n].is_floating_point() else batch[n] for n in names]
    print(f"{model(*inputs).item():.9g}")
    sys.exit(0)


fwd = torch.compile(model) if args.compile else model


def step():
    model.zero_grad(set_to_none=True)
    if args.autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fwd(*inputs)
    else:
        loss = fwd(*inputs)
    loss.backward()
    return loss


base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
compile_ms = None
if args.compile:
    t0 = time.perf_counter()
    step()
    compile_ms = round((time.perf_counter() - t0) * 1e3, 1)
for _ in range(args.warmup):
    step()
times = []
for _ in range(args.steps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1e3)
peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if args.compile:
    print(json.dumps({"step_ms_median": round(statistics.median(times), 3), "step_ms_min": round(min(times), 3),
                      "compile_ms": compile_ms, "peak_rss_bytes": peak_rss, "base_rss_bytes": base_rss,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))
    sys.exit(0)

# The ops of one step, twice.  torch.profiler records every aten:: call,
# composites and the calls kernels make inside themselves (bmm's per-batch
# selects, say) included: aten_ops.  A dispatch mode sees each operator
# that autograd dispatches to a kernel, forward and backward, once: those
# that do work (not views or metadata) are the step's kernels, and the
# GEMMs among them are recorded with their shapes and transposes.
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    step()
aten_ops = sum(1 for e in prof.events() if e.name.startswith("aten::"))

VIEWS = {
    "_reshape_alias", "_unsafe_view", "alias", "as_strided", "detach", "expand", "permute", "select", "slice",
    "squeeze", "t", "transpose", "unsqueeze", "view", "split", "unbind", "narrow", "lift_fresh",
}
GEMMS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "mv": (0, 1),
         "addmv": (1, 2), "dot": (0, 1)}


def transposed(t):
    """Whether a matrix operand is a transposed view (the BLAS gets a flag)."""
    if t.dim() < 2 or t.is_contiguous():
        return False
    return t.stride(-2) == 1 and t.stride(-1) == t.shape[-2]


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.gemms = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if name in GEMMS:
            i, j = GEMMS[name]
            a, b = args[i], args[j]
            self.gemms.append((tuple(a.shape), transposed(a), tuple(b.shape), transposed(b)))
        return func(*args, **(kwargs or {}))


with Ops() as seen:
    step()
kernels = sum(1 for n in seen.ops if n not in VIEWS)
gemm_list = seen.gemms


def operand(shape, trans):
    if not trans:
        return torch.randn(*shape) * 0.05
    s = list(shape)
    s[-2], s[-1] = s[-1], s[-2]
    return (torch.randn(*s) * 0.05).transpose(-2, -1)


def gemm_floor(gemms, steps, warmup):
    pairs = [(operand(sa, ta), operand(sb, tb)) for sa, ta, sb, tb in gemms]
    for _ in range(warmup):
        for a, b in pairs:
            torch.matmul(a, b)
    t = []
    for _ in range(max(steps, 3)):
        t0 = time.perf_counter()
        for a, b in pairs:
            torch.matmul(a, b)
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


out = {
    "step_ms_median": round(statistics.median(times), 3),
    "step_ms_min": round(min(times), 3),
    "gemm_floor_ms": round(gemm_floor(gemm_list, args.steps, 1), 3),
    "peak_rss_bytes": peak_rss,
    "base_rss_bytes": base_rss,
    "aten_ops": aten_ops,
    "kernels": kernels,
    "ops": len(seen.ops),
    "gemms": len(gemm_list),
    "threads": torch.get_num_threads(),
    "torch": torch.__version__,
}
print(json.dumps(out))

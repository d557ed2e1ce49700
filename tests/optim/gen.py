#!/usr/bin/python3
"""Expected optimiser trajectories for tests/unit/test_optim.c, from PyTorch.

    /usr/bin/python3 tests/optim/gen.py      # writes tests/optim/expected.json

Needs torch (Debian's /usr/bin/python3 has 1.13).  Output is deterministic.
Every number in expected.json comes from torch.optim, never from gradc.

The model is tests/optim/quad.gdl (float64; quad32.gdl is the same in
float32):

    loss lin  = sum(g1 * w1) + sum(g2 * w2)          g1, g2: inputs
    loss quad = 0.5 * (sum(w1 * w1) + sum(w2 * w2))

so the gradient of the objective is g + w: the inputs choose it each step
and the params feed back into it.  Each case starts from fixed params, and
for each of its steps: computes the losses and gradients with autograd,
clips with torch.nn.utils.clip_grad_norm_ (max_norm inf when clipping is off,
which only measures the norm), takes one torch.optim.SGD or AdamW step and
one LambdaLR step.  It records, per step, the inputs, the learning rate the
step used, the losses, the gradient norm before clipping and the params
after the step.

The learning-rate schedule is include/gradc.h's (warmup_steps, total_steps,
min_lr), written as the LambdaLR factor `schedule` below: for the step that
follows t completed steps,

    t < warmup:           lr * (t + 1) / warmup
    total_steps == 0:     lr
    otherwise:            p = min(max(t - warmup, 0) / (total - warmup), 1)
                          min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
"""
import sys
sys.dont_write_bytecode = True

import json
import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def schedule(o):
    """The LambdaLR factor for gradc_optimizer_options o."""
    lr, w, total, lo = o["lr"], o["warmup_steps"], o["total_steps"], o["min_lr"]

    def factor(t):
        if t < w:
            return (t + 1) / w
        if total == 0:
            return 1.0
        p = min(max(t - w, 0) / max(total - w, 1), 1.0)
        return (lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * p))) / lr

    return factor


def options(kind, **kw):
    """gradc_optimizer_options with torch's defaults (gradc_optimizer_options_init)."""
    o = {"kind": kind, "lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "nesterov": 0,
         "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "weight_decay": 0.01 if kind == "adamw" else 0.0, "clip_norm": 0.0,
         "warmup_steps": 0, "total_steps": 0, "min_lr": 0.0}
    for k, v in kw.items():
        assert k in o, k
        o[k] = v
    return o


CASES = [
    ("sgd", "quad", 5, options("sgd", lr=0.1)),
    ("sgd_momentum", "quad", 5, options("sgd", lr=0.05, momentum=0.9)),
    ("sgd_dampening_wd", "quad", 5, options("sgd", lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("sgd_nesterov_wd", "quad", 5, options("sgd", lr=0.05, momentum=0.9, nesterov=1, weight_decay=0.05)),
    ("sgd_clip", "quad", 5, options("sgd", lr=0.1, momentum=0.5, clip_norm=4.5)),
    ("sgd_warmup", "quad", 5, options("sgd", lr=0.1, momentum=0.9, warmup_steps=3)),
    ("adamw", "quad", 5, options("adamw", lr=1e-2)),
    ("adamw_betas_eps_wd", "quad", 5, options("adamw", lr=3e-2, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1)),
    ("adamw_no_wd", "quad", 5, options("adamw", lr=2e-2, weight_decay=0.0)),
    ("adamw_cosine", "quad", 6, options("adamw", lr=5e-2, total_steps=5)),
    ("adamw_clip_warmup_cosine", "quad", 8,
     options("adamw", lr=1e-2, clip_norm=4.0, warmup_steps=2, total_steps=6, min_lr=1e-3)),
    ("sgd_warmup_cosine_min_lr", "quad", 6,
     options("sgd", lr=0.2, momentum=0.9, nesterov=1, warmup_steps=1, total_steps=5, min_lr=0.02)),
    ("adamw_f32", "quad32", 5, options("adamw", lr=1e-2, clip_norm=6.0, warmup_steps=1, total_steps=5)),
    ("sgd_f32", "quad32", 5, options("sgd", lr=0.05, momentum=0.9, weight_decay=0.01)),
]


def run_case(name, model, nsteps, o, gen):
    dtype = torch.float64 if model == "quad" else torch.float32
    # Params and per-step gradients of order 1; rounded to the dtype first
    # so that C reads exactly the values torch starts from.
    w1 = torch.randn(3, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    w2 = torch.randn(2, 2, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    init = {"w1": w1.detach().double().flatten().tolist(), "w2": w2.detach().double().flatten().tolist()}
    params = [w1, w2]
    if o["kind"] == "sgd":
        opt = torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], dampening=o["dampening"],
                              nesterov=bool(o["nesterov"]), weight_decay=o["weight_decay"])
    else:
        opt = torch.optim.AdamW(params, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                weight_decay=o["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(o))
    steps = []
    for t in range(nsteps):
        g1 = (1.5 * torch.randn(1, 3, generator=gen, dtype=torch.float64)).to(dtype)
        g2 = (1.5 * torch.randn(1, 2, 2, generator=gen, dtype=torch.float64)).to(dtype)
        opt.zero_grad()
        lin = (g1 * w1).sum() + (g2 * w2).sum()
        quad = 0.5 * ((w1 * w1).sum() + (w2 * w2).sum())
        (lin + quad).backward()
        max_norm = o["clip_norm"] if o["clip_norm"] > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        steps.append({
            "g1": g1.double().flatten().tolist(), "g2": g2.double().flatten().tolist(),
            "lr": lr, "losses": [float(lin), float(quad)], "grad_norm": norm,
            "w1": w1.detach().double().flatten().tolist(), "w2": w2.detach().double().flatten().tolist(),
        })
    return {"name": name, "model": model + ".gdl", "options": o, "init": init, "steps": steps}


def main():
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(20240917)
    cases = [run_case(n, m, k, o, gen) for n, m, k, o in CASES]
    # Sanity: clipping must be active on some steps and not on others, or
    # the clipping cases would not test it.
    for c in cases:
        if c["options"]["clip_norm"] > 0:
            norms = [s["grad_norm"] for s in c["steps"]]
            assert any(n > c["options"]["clip_norm"] for n in norms), c["name"]
            assert any(n < c["options"]["clip_norm"] for n in norms), c["name"]
    out = {
        "generator": "tests/optim/gen.py (torch %s)" % torch.__version__,
        "tolerance": {"f64": 1e-6, "f32": 1e-5},
        "cases": cases,
    }
    path = os.path.join(HERE, "expected.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote %s: %d cases, %d steps" % (path, len(cases), sum(len(c["steps"]) for c in cases)))


if __name__ == "__main__":
    main()

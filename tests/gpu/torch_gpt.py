#!/usr/bin/env python3
"""examples/tinygpt.gdl in PyTorch on the GPU: the step time that `gradc bench
--target cuda` is compared with (tests/gpu/run.sh).

    python3 torch_gpt.py [-D NAME=V]... [--steps N] [--warmup N] [--allow-tf32] [--json]

Same sizes and defaults as the model (B=8 T=32 C=64 NH=4 L=2 V=96), float32,
TF32 off unless --allow-tf32 (DESIGN.md: benchmarks compare at equal
precision); one step is zero_grad, forward, cross_entropy, backward,
synchronised.  Prints step_ms_median and step_ms_min as gradc bench does.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-D", dest="defs", action="append", default=[], metavar="NAME=V")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--allow-tf32", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = dict(B=8, T=32, C=64, NH=4, L=2, V=96)
    for s in a.defs:
        k, v = s.split("=")
        d[k] = int(v)
    B, T, C, NH, L, V = (d[k] for k in ("B", "T", "C", "NH", "L", "V"))
    HD, Fd = C // NH, 4 * C
    torch.backends.cuda.matmul.allow_tf32 = a.allow_tf32
    torch.backends.cudnn.allow_tf32 = a.allow_tf32
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)

    def p(*shape, std=0.02, fill=None):
        t = torch.full(shape, fill) if fill is not None else torch.randn(*shape, generator=g) * std
        return t.to(dev).requires_grad_()

    wte, wpe = p(V, C), p(T, C, std=0.01)
    ln1_w, ln1_b, ln2_w, ln2_b = p(L, C, fill=1.0), p(L, C, fill=0.0), p(L, C, fill=1.0), p(L, C, fill=0.0)
    attn_w, attn_b, proj_w, proj_b = p(L, C, 3 * C), p(L, 3 * C, fill=0.0), p(L, C, C, std=0.01), p(L, C, fill=0.0)
    fc_w, fc_b, fcp_w, fcp_b = p(L, C, Fd), p(L, Fd, fill=0.0), p(L, Fd, C, std=0.01), p(L, C, fill=0.0)
    lnf_w, lnf_b = p(C, fill=1.0), p(C, fill=0.0)
    params = [wte, wpe, ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcp_w, fcp_b,
              lnf_w, lnf_b]
    idx = torch.randint(0, V, (B, T), generator=g).to(dev)
    tgt = torch.randint(0, V, (B, T), generator=g).to(dev)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1)

    def heads(t):
        return t.reshape(B, T, NH, HD).permute(0, 2, 1, 3)

    def step():
        for q in params:
            q.grad = None
        x = wte[idx] + wpe
        for l in range(L):
            h = F.layer_norm(x, (C,), ln1_w[l], ln1_b[l])
            qkv = h @ attn_w[l] + attn_b[l]
            q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:])
            att = (q @ k.transpose(-2, -1)) * HD ** -0.5
            att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
            y = (att @ v).permute(0, 2, 1, 3).reshape(B, T, C)
            x = x + y @ proj_w[l] + proj_b[l]
            h = F.layer_norm(x, (C,), ln2_w[l], ln2_b[l])
            x = x + F.gelu(h @ fc_w[l] + fc_b[l], approximate="tanh") @ fcp_w[l] + fcp_b[l]
        x = F.layer_norm(x, (C,), lnf_w, lnf_b)
        loss = F.cross_entropy((x @ wte.t()).reshape(B * T, V), tgt.reshape(-1))
        loss.backward()
        torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    med = ms[len(ms) // 2] if len(ms) % 2 else 0.5 * (ms[len(ms) // 2 - 1] + ms[len(ms) // 2])
    out = {"step_ms_median": round(med, 3), "step_ms_min": round(ms[0], 3),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print("%s: %s" % (k, v))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""JAX twins of examples/tinygpt.gdl, examples/mlp.gdl and
bench/models/mlp2.gdl (the same math as bench/torch_models.py), timed as
`gradc bench` times gradc: forward and backward of one batch through
jax.jit(jax.value_and_grad(loss)), f32 on the CPU.

Threads: the caller pins the process (taskset) and, for one thread, sets
XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1
before this starts (bench/run.py does both).

Prints one JSON object: compile_ms (the first call: tracing, XLA
compilation and one step), step_ms_median, step_ms_min, peak_rss_bytes,
base_rss_bytes, jax (the version).

Usage: jax_models.py tinygpt|mlp|mlp2 [-D NAME=V]... [--steps N] [--warmup N]
"""
import argparse
import json
import resource
import statistics
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("model", choices=["tinygpt", "mlp", "mlp2"])
ap.add_argument("-D", dest="defs", action="append", default=[], metavar="NAME=V")
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--threads", type=int, default=1, help="recorded only: the caller sets the threads")
args = ap.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_platforms", "cpu")


def dims(defaults):
    d = dict(defaults)
    for s in args.defs:
        k, v = s.split("=")
        if k not in d:
            sys.exit(f"jax_models.py: {args.model} has no dim {k}")
        d[k] = int(v)
    return d


key = jax.random.PRNGKey(0)


def normal(shape, std):
    global key
    key, k = jax.random.split(key)
    return jax.random.normal(k, shape, jnp.float32) * std


def layer_norm(x, w, b, eps=1e-5):
    m = jnp.mean(x, axis=-1, keepdims=True)
    v = jnp.mean((x - m) ** 2, axis=-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + eps) * w + b


def cross_entropy(logits, y):
    lp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, y[..., None], axis=-1))


if args.model == "tinygpt":
    d = dims({"B": 8, "T": 32, "C": 64, "NH": 4, "L": 2, "V": 96})
    B, T, C, NH, L, V = d["B"], d["T"], d["C"], d["NH"], d["L"], d["V"]
    HD, Fw = C // NH, 4 * C
    params = {
        "wte": normal((V, C), 0.02), "wpe": normal((T, C), 0.01),
        "ln1_w": jnp.ones((L, C)), "ln1_b": jnp.zeros((L, C)),
        "attn_w": normal((L, C, 3 * C), 0.02), "attn_b": jnp.zeros((L, 3 * C)),
        "proj_w": normal((L, C, C), 0.01), "proj_b": jnp.zeros((L, C)),
        "ln2_w": jnp.ones((L, C)), "ln2_b": jnp.zeros((L, C)),
        "fc_w": normal((L, C, Fw), 0.02), "fc_b": jnp.zeros((L, Fw)),
        "fcp_w": normal((L, Fw, C), 0.01), "fcp_b": jnp.zeros((L, C)),
        "lnf_w": jnp.ones((C,)), "lnf_b": jnp.zeros((C,)),
    }
    mask = jnp.triu(jnp.ones((T, T), bool), 1)

    def heads(t):
        return t.reshape(B, T, NH, HD).transpose(0, 2, 1, 3)

    def loss(p, idx, targets):
        x = p["wte"][idx] + p["wpe"]
        for l in range(L):
            h = layer_norm(x, p["ln1_w"][l], p["ln1_b"][l])
            qkv = h @ p["attn_w"][l] + p["attn_b"][l]
            q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), heads(qkv[..., 2 * C:])
            att = q @ k.transpose(0, 1, 3, 2) * HD ** -0.5
            att = jax.nn.softmax(jnp.where(mask, -jnp.inf, att), axis=-1)
            y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
            x = x + y @ p["proj_w"][l] + p["proj_b"][l]
            h = layer_norm(x, p["ln2_w"][l], p["ln2_b"][l])
            x = x + jax.nn.gelu(h @ p["fc_w"][l] + p["fc_b"][l], approximate=True) @ p["fcp_w"][l] + p["fcp_b"][l]
        x = layer_norm(x, p["lnf_w"], p["lnf_b"])
        return cross_entropy(x @ p["wte"].T, targets)

    key, k1, k2 = jax.random.split(key, 3)
    batch = (jax.random.randint(k1, (B, T), 0, V), jax.random.randint(k2, (B, T), 0, V))
else:
    two = args.model == "mlp2"
    d = dims({"B": 256, "D": 784, "H": 1024} if two else {"B": 64, "D": 784, "H": 256})
    B, D, H = d["B"], d["D"], d["H"]
    params = {"W1": normal((D, H), 0.02), "b1": jnp.zeros((H,)), "W3": normal((H, 10), 0.02)}
    if two:
        params.update({"W2": normal((H, H), 0.02), "b2": jnp.zeros((H,))})

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["W1"] + p["b1"])
        if two:
            h = jax.nn.relu(h @ p["W2"] + p["b2"])
        return cross_entropy(h @ p["W3"], y) + 1e-4 * jnp.sum(p["W1"] * p["W1"])

    key, k1, k2 = jax.random.split(key, 3)
    batch = (jax.random.normal(k1, (B, D)), jax.random.randint(k2, (B,), 0, 10))

step = jax.jit(jax.value_and_grad(loss))
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
jax.block_until_ready(step(params, *batch))
compile_ms = (time.perf_counter() - t0) * 1e3
for _ in range(args.warmup):
    jax.block_until_ready(step(params, *batch))
times = []
for _ in range(args.steps):
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, *batch))
    times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({
    "compile_ms": round(compile_ms, 1),
    "step_ms_median": round(statistics.median(times), 3),
    "step_ms_min": round(min(times), 3),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "base_rss_bytes": base_rss,
    "jax": jax.__version__,
}))

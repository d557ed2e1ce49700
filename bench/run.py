#!/usr/bin/python3
"""Run `gradc bench` and its PyTorch twin (bench/torch_models.py) side by
side, in one run, for tinygpt large, tinygpt small, mlp and mlp2
(bench/models/mlp2.gdl) at 1 and 2 threads, and print one table of ratios (markdown):

  step/floor     gradc step / gradc GEMM floor (the step's GEMMs alone)
  vs torch       gradc step / torch step (both medians, same threads, f32)
  RSS ratio      gradc peak RSS / torch peak RSS (whole processes; torch's
                 includes ~240 MB for importing torch, shown apart)
  compile        gradc cold / warm compile (ms)
  kernels        gradc kernels_per_step vs torch kernels (operators that do
                 work, forward and backward) and torch.profiler's aten op
                 count

--gemm-lib also measures SGEMM GFLOP/s at each model's GEMM shapes with
OpenBLAS and BLIS (bench/gemm_lib.c, compiled here against each).
--results FILE writes the tables into FILE between marker comments, with
the machine, the command and the date, leaving the rest of FILE as is.

Usage: bench/run.py [--gradc build/gradc] [--steps 10] [--threads 1,2]
                    [--repeat R] [--quiet-wait S] [--target cpu] [--gemm-lib] [--results bench/RESULTS.md]
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"  # Debian's torch

CONFIGS = [
    ("tinygpt large", "tinygpt", ["B=16", "T=128", "C=256", "L=4", "NH=4", "V=96"]),
    ("tinygpt small", "tinygpt", ["B=8", "T=32", "C=64", "L=2"]),
    # examples/mlp.gdl has one hidden layer (D -> H -> 10), benched as written.
    ("mlp", "mlp", ["B=256", "D=784", "H=1024"]),
    # The benchmarks' 784-1024-1024-10 MLP: bench/models/mlp2.gdl, two hidden layers.
    ("mlp2", "mlp2", ["B=256", "D=784", "H=1024"]),
]


def model_path(model):
    """examples/MODEL.gdl, else bench/models/MODEL.gdl (models only the bench uses)."""
    p = os.path.join(ROOT, "examples", model + ".gdl")
    return p if os.path.exists(p) else os.path.join(ROOT, "bench", "models", model + ".gdl")


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gradc", default=os.path.join(ROOT, "build", "gradc"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every cell this many times, in rounds over all cells, gradc and torch alternately, "
                         "and keep each one's fastest run (by median step): a shared machine's noise only ever "
                         "slows a run down")
    ap.add_argument("--quiet-wait", type=float, default=0, metavar="SECONDS",
                    help="before each run, wait up to this long for the other processes on the machine to "
                         "leave the CPUs idle (under 0.2 CPUs busy over half a second)")
    ap.add_argument("--only", help="run only configs whose name contains this")
    ap.add_argument("--gemm-lib", action="store_true")
    ap.add_argument("--gemm-lib-only", action="store_true", help="only the OpenBLAS/BLIS comparison")
    ap.add_argument("--results")
    return ap.parse_args()


def sh(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def defs_args(defs):
    out = []
    for d in defs:
        out += ["-D", d]
    return out


# Figures a run measures apart from its step, each kept at its best over
# the runs of a cell on its own (the step's pair, median and min, comes
# from the run with the fastest median): noise only ever slows a run down,
# and a disturbance can fall on a run's floor but not on its step.
GRADC_MINS = ("gemm_floor_ms", "compile_ms", "compile_warm_ms")


def fastest(best, run, mins):
    """The run with the faster median step, with each of `mins` the least of the two runs'."""
    if not run:
        return best
    if not best:
        return dict(run)
    out = dict(run if run["step_ms_median"] < best["step_ms_median"] else best)
    for k in mins:
        out[k] = min(best[k], run[k])
    return out


def run_gradc(a, model, defs, threads, cache):
    cmd = [a.gradc, "bench", model_path(model)] + defs_args(defs) + [
        "--threads", str(threads), "--steps", str(a.steps), "--warmup", str(a.warmup), "--target", a.target,
        "--json"]
    env = dict(os.environ, GRADC_CACHE_DIR=cache)
    rc, out, err = sh(cmd, env)
    if rc != 0:
        return None, err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
    return json.loads(out), None


def run_torch(a, model, defs, threads):
    cmd = [PY, os.path.join(ROOT, "bench", "torch_models.py"), model] + defs_args(defs) + [
        "--threads", str(threads), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    rc, out, err = sh(cmd)
    if rc != 0:
        return None, err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
    return json.loads(out), None


def mb(x):
    return f"{x / 2**20:.0f}"


def ratio(x, y):
    return f"{x / y:.2f}" if y else "-"


def step_table(a, rows):
    lines = [
        "| model | thr | gradc step ms (med/min) | torch step ms (med/min) | gradc/torch | gradc floor ms "
        "| step/floor | torch floor ms | torch step/floor | gradc RSS MB | torch RSS MB (Δstep) | RSS ratio "
        "| compile cold/warm ms | kernels gradc / torch (aten ops) | GEMMs gradc / torch | arena MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, thr, g, gerr, t, terr in rows:
        if g is None and t is None:
            lines.append(f"| {name} | {thr} | failed: {gerr} | failed: {terr} |" + " |" * 14)
            continue
        gs = f"{g['step_ms_median']:.2f} / {g['step_ms_min']:.2f}" if g else f"failed: {gerr}"
        ts = f"{t['step_ms_median']:.2f} / {t['step_ms_min']:.2f}" if t else f"failed: {terr}"
        cells = [name, str(thr), gs, ts]
        if g and t:
            cells.append(ratio(g["step_ms_median"], t["step_ms_median"]))
        else:
            cells.append("-")
        if g:
            cells += [f"{g['gemm_floor_ms']:.2f}", ratio(g["step_ms_median"], g["gemm_floor_ms"])]
        else:
            cells += ["-", "-"]
        if t:
            cells += [f"{t['gemm_floor_ms']:.2f}", ratio(t["step_ms_median"], t["gemm_floor_ms"])]
        else:
            cells += ["-", "-"]
        cells.append(mb(g["peak_rss_bytes"]) if g else "-")
        cells.append(f"{mb(t['peak_rss_bytes'])} ({mb(t['peak_rss_bytes'] - t['base_rss_bytes'])})" if t else "-")
        cells.append(ratio(g["peak_rss_bytes"], t["peak_rss_bytes"]) if g and t else "-")
        cells.append(f"{g['compile_ms']:.1f} / {g['compile_warm_ms']:.1f}" if g else "-")
        gk = str(g["kernels_per_step"]) if g else "-"
        tk = f"{t['kernels']} ({t['aten_ops']})" if t else "-"
        cells.append(f"{gk} / {tk}")
        cells.append(f"{g['gemms_per_step'] if g else '-'} / {t['gemms'] if t else '-'}")
        cells.append(f"{g['peak_bytes'] / 2**20:.1f}" if g else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gemm_flops(fields):
    """2*M*N*K*BATCH of one `M N K BATCH TA TB BETA GFLOPS` line of gemm_lib."""
    M, N, K, B = (int(x) for x in fields[:4])
    return 2.0 * M * N * K * B


def gemm_lib(a, threads_list, tmp):
    """SGEMM GFLOP/s at each config's GEMM shapes, OpenBLAS vs BLIS."""
    src = os.path.join(ROOT, "bench", "gemm_lib.c")
    libs = {
        "openblas": ["-DLIB_OPENBLAS", "-I/usr/include/x86_64-linux-gnu/openblas-pthread", "-lopenblas"],
        "blis": ["-DLIB_BLIS", "-I/usr/include/x86_64-linux-gnu/blis-pthread",
                 "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so", "-lpthread", "-lm"],
    }
    exe = {}
    for lib, flags in libs.items():
        out = os.path.join(tmp, "gemm_" + lib)
        cmd = ["cc", "-O2", "-o", out, src] + flags
        rc, _, err = sh(cmd)
        if rc != 0:
            print(f"run.py: cannot build gemm_lib against {lib}: {err.strip()}", file=sys.stderr)
            continue
        exe[lib] = out
    lines = ["| model | thr | GEMMs | " + " | ".join(f"{lib} ms (GFLOP/s)" for lib in exe) + " | " +
             " | ".join(f"{lib} Σ per-shape ms" for lib in exe) + " | per-shape median GFLOP/s " + " / ".join(exe) + " |",
             "|---|---|---|" + "---|" * (2 * len(exe)) + "---|"]
    detail = []
    for name, model, defs in CONFIGS:
        if a.only and a.only not in name:
            continue
        cmd = [a.gradc, "bench", model_path(model)] + defs_args(defs) + [
            "--steps", "1", "--warmup", "0", "--target", a.target, "--print-gemms", "--no-cache"]
        rc, _, err = sh(cmd)
        shapes = "\n".join(l for l in err.splitlines() if l.startswith("gemm "))
        if rc != 0 or not shapes:
            lines.append(f"| {name} | - | failed: {err.strip().splitlines()[-1] if err.strip() else rc} |")
            continue
        for thr in threads_list:
            res = {}
            for r in range(a.repeat):  # alternate the libraries; keep each one's fastest run
                for lib, path in exe.items():
                    wait_quiet(a)
                    p = subprocess.run([path, str(thr)], input=shapes, capture_output=True, text=True)
                    per = [l.split() for l in p.stdout.splitlines() if l and l[0].isdigit()]
                    tot = [l.split() for l in p.stdout.splitlines() if l.startswith("total")]
                    run = (float(tot[0][1]), float(tot[0][2]), [float(x[-1]) for x in per], per)
                    if lib not in res or run[0] < res[lib][0]:
                        res[lib] = run
            n = len(next(iter(res.values()))[2])
            cells = [name, str(thr), str(n)]
            cells += [f"{res[l][0]:.2f} ({res[l][1]:.0f})" for l in exe]
            # The list's time from each shape's best measurement: steadier on
            # a shared machine than one timing of the whole list.
            cells += [f"{sum(gemm_flops(x) / gf / 1e6 for x, gf in zip(res[l][3], res[l][2])):.2f}" for l in exe]
            cells.append(" / ".join(f"{statistics.median(res[l][2]):.0f}" for l in exe))
            lines.append("| " + " | ".join(cells) + " |")
            # One row per distinct shape: how many the step has, median GFLOP/s.
            by_shape = {}
            for i in range(n):
                key = " ".join(res[next(iter(exe))][3][i][:7])
                by_shape.setdefault(key, []).append(i)
            for key, idx in by_shape.items():
                detail.append(f"| {name} | {thr} | {key} | {len(idx)} | " +
                              " | ".join(f"{statistics.median(res[l][2][i] for i in idx):.0f}" for l in exe) + " |")
    head = "| model | thr | M N K batch TA TB beta | count | " + " | ".join(f"{l} GFLOP/s" for l in exe) + " |"
    sep = "|---|---|---|---|" + "---|" * len(exe)
    return "\n".join(lines), "\n".join([head, sep] + detail)


def machine():
    rc, out, _ = sh(["lscpu"])
    model = re.search(r"Model name:\s*(.*)", out)
    cpus = re.search(r"^CPU\(s\):\s*(\d+)", out, re.M)
    fam = re.search(r"CPU family:\s*(\d+)", out)
    mod = re.search(r"^Model:\s*(\d+)", out, re.M)
    flags = re.search(r"Flags:\s*(.*)", out)
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if flags and f in flags.group(1).split()]
    rc, date, _ = sh(["date", "-u"])
    fm = f" family {fam.group(1)} model {mod.group(1)}" if fam and mod else ""
    return (f"{model.group(1) if model else '?'}{fm}, {cpus.group(1) if cpus else '?'} cores ({', '.join(isa)})",
            date.strip())


def busy(interval=0.5):
    """CPUs kept busy by anything over `interval` seconds (/proc/stat, in
    USER_HZ = 100 ticks; idle ticks are not counted reliably in a VM, so
    busy time is measured against the wall clock)."""
    def sample():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]  # user nice system irq softirq steal
    b0, t0 = sample(), time.time()
    time.sleep(interval)
    b1, t1 = sample(), time.time()
    return (b1 - b0) / 100.0 / (t1 - t0)


def wait_quiet(a):
    """Wait for the machine to go idle (at most --quiet-wait seconds)."""
    end = time.time() + a.quiet_wait
    while time.time() < end and busy() > 0.2:
        time.sleep(1)


def load():
    """The 1-minute load average: other work on the machine shows here."""
    return open("/proc/loadavg").read().split()[0]


def replace_section(text, tag, body):
    begin, end = f"<!-- run.py:{tag} -->", f"<!-- /run.py:{tag} -->"
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        return text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main():
    a = parse()
    threads = [int(x) for x in a.threads.split(",")]
    rows = []
    load0 = load()
    a.gemm_lib = a.gemm_lib or a.gemm_lib_only
    with tempfile.TemporaryDirectory(prefix="gradc-bench-") as tmp:
        cells = [(name, model, defs, thr) for name, model, defs in CONFIGS for thr in threads
                 if not a.gemm_lib_only and not (a.only and a.only not in name)]
        best = {}  # cell index -> [g, gerr, t, terr]
        # Rounds over every cell rather than repeats of one cell in a row: a
        # disturbance of this shared machine lasts minutes, and would spoil
        # every repeat of the one cell it falls on.
        for r in range(a.repeat):
            for i, (name, model, defs, thr) in enumerate(cells):
                g, gerr, t, terr = best.setdefault(i, [None, None, None, None])
                # A fresh cache each time: cold, then warm from what the cold run wrote.
                cache = os.path.join(tmp, f"cache-{model}-{i}-{r}")
                wait_quiet(a)
                g1, gerr = run_gradc(a, model, defs, thr, cache)
                wait_quiet(a)
                t1, terr = run_torch(a, model, defs, thr)
                best[i] = [fastest(g, g1, GRADC_MINS), gerr, fastest(t, t1, ("gemm_floor_ms",)), terr]
                print(f"round {r + 1}: {name} threads={thr}: gradc {g1 or gerr}\n  torch {t1 or terr}", file=sys.stderr)
        for i, (name, model, defs, thr) in enumerate(cells):
            g, gerr, t, terr = best[i]
            rows.append((name, thr, g, gerr, t, terr))
        table = step_table(a, rows) if rows else None
        if table:
            print(table)
        lib_table = lib_detail = None
        if a.gemm_lib:
            lib_table, lib_detail = gemm_lib(a, threads, tmp)
            print()
            print(lib_table)
            print()
            print(lib_detail)
    if a.results:
        cpu, date = machine()
        cmd = "bench/run.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
        text = open(a.results).read() if os.path.exists(a.results) else "# Benchmarks\n"
        head = (f"Machine: {cpu}.  Date: {date}.  Command: `{cmd}` "
                f"({a.steps} timed windows after {a.warmup} warm-up, target {a.target}; best of {a.repeat} "
                f"runs per cell, in rounds over all cells).  Load average before / after: {load0} / {load()}.")
        if table:
            text = replace_section(text, "steps", head + "\n\n" + table)
        if lib_table:
            text = replace_section(text, "gemm-lib", head + "\n\n" + lib_table + "\n\nPer shape:\n\n" + lib_detail)
        with open(a.results, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

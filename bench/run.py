#!/usr/bin/python3
"""Run `gradc bench` and its peers side by side, in one run, for tinygpt
large, tinygpt small, mlp and mlp2 (bench/models/mlp2.gdl) at 1 and 2
threads, and print the tables of bench/RESULTS.md (markdown).

Peers: current PyTorch from PyPI, eager and torch.compile
(bench/torch_models.py), and jax[cpu] jit (bench/jax_models.py), from a
virtual environment under the build directory that --setup-peers creates
(pip install torch jax[cpu]: several GB with torch's CUDA wheels, so never
in CI).  Without it, Debian's torch (/usr/bin/python3) is the only peer.
Every process of a cell is pinned to the same CPUs (taskset: CPU 0 for one
thread, 0..N-1 for N) and told the same thread count (gradc --threads,
torch.set_num_threads, XLA_FLAGS for one thread); f32 throughout.

Step table columns:
  gradc step     median / min ms of a window (forward + backward)
  provider       the GEMM provider gradc chose on this host (gemm_provider)
  floor          gradc's GEMM floor with that provider, and the best
                 provider's floor (with --gemm-lib; else the same)
  step/floor     gradc step / best floor (target <= 1.05)
  eager, compile, jax   the peers' median step ms; beside eager's, torch's
                 GEMM floor (the step's mm/bmm/addmm alone, torch_models.py)
  vs best torch  gradc step / the faster of eager and torch.compile
                 (targets: tinygpt large 0.8, tinygpt small 0.6, mlp and mlp2 0.8)
  RSS            peak RSS MB, gradc / torch eager
  cold compile   ms: gradc (object cache bypassed; the host's GEMM provider
                 measurement, made once a host and cached, is timed apart:
                 gemm_select_ms, on the conditions line) / torch.compile / jax jit

--gemm-lib also runs gradc under GRADC_GEMM=onednn, openblas and blis and
reports each provider's step and floor, the host's measured choice, and
the fused-epilogue measurement (bench/gemm_epilogue.c).
--precision f32,bf16 also runs gradc at each precision after f32 (`gradc
bench --precision P`: autocast-style mixed precision, docs/DECISIONS.md)
and prints gradc P's step against gradc f32's (target for bf16 on a CPU
with AMX or AVX512-BF16: <= 0.5); with bf16, PyTorch eager and
torch.compile also run under torch.autocast (CPU, bfloat16) and gradc
bf16's step is compared with the faster of them (target <= 0.8).
--loss-curve STEPS trains the demo's model (tools/demo.sh: tinygpt, 3
layers of width 96, on the project's docs, same flags and seed) for STEPS
steps in f32 and in bf16 and tabulates both losses and their gap (target:
within 2% at the end).
--results FILE writes the tables into FILE between marker comments, with
the machine, the command, the date and the load, leaving the rest as is.

After the tables (and in the header --results writes) it prints the
conditions the runs had: one core's f32 FMA throughput before and after
(bench/fma_peak.c, at each thread count: the same CPU model has run here
at 238 GFLOP/s a core on one host and 60-155 on another, so milliseconds
from two runs compare only beside it), the share of CPU time the
hypervisor stole during the runs (/proc/stat), and a cache line's round
trip between the two cores just before and just after each multi-thread
run, the larger of the two (bench/core_latency.c: a VM's two CPUs sit on
one die of the host or on two, which the host can change within seconds;
apart, a two-thread step that hands its rows from core to core runs at
about one thread's speed), over all runs and over the runs the table
keeps.

The whole RESULTS table, on a quiet machine:
  bench/run.py --setup-peers --gemm-lib --repeat 3 --quiet-wait 30 --results bench/RESULTS.md

Usage: bench/run.py [--gradc build/gradc] [--steps N] [--threads 1,2] [--repeat R]
                    [--quiet-wait S] [--setup-peers] [--gemm-lib] [--only NAME] [--precision f32,bf16]
                    [--loss-curve STEPS] [--no-steps] [--results FILE]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"  # Debian's torch

# name, model, -D values, timed windows (without --steps): a median of 10
# windows of 2-30 ms moved by 10-20% between runs on a shared host, so the
# short models time 50 (a second or two a run); tinygpt large's 10 windows
# take 3-6 s already.
CONFIGS = [
    ("tinygpt large", "tinygpt", ["B=16", "T=128", "C=256", "L=4", "NH=4", "V=96"], 10),
    ("tinygpt small", "tinygpt", ["B=8", "T=32", "C=64", "L=2"], 50),
    # examples/mlp.gdl has one hidden layer (D -> H -> 10), benched as written.
    ("mlp", "mlp", ["B=256", "D=784", "H=1024"], 50),
    # The benchmarks' 784-1024-1024-10 MLP: bench/models/mlp2.gdl, two hidden layers.
    ("mlp2", "mlp2", ["B=256", "D=784", "H=1024"], 50),
]


def model_path(model):
    """examples/MODEL.gdl, else bench/models/MODEL.gdl (models only the bench uses)."""
    p = os.path.join(ROOT, "examples", model + ".gdl")
    return p if os.path.exists(p) else os.path.join(ROOT, "bench", "models", model + ".gdl")


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gradc", default=os.path.join(ROOT, "build", "gradc"))
    ap.add_argument("--steps", type=int, help="timed windows of every cell (default: CONFIGS', 10 or 50)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every cell this many times, in rounds over all cells, gradc and its peers in turn, "
                         "and keep each one's fastest run (by median step): a shared machine's noise only ever "
                         "slows a run down")
    ap.add_argument("--quiet-wait", type=float, default=0, metavar="SECONDS",
                    help="before each run, wait up to this long for the other processes on the machine to "
                         "leave the CPUs idle (under 0.2 CPUs busy over half a second)")
    ap.add_argument("--only", help="run only configs whose name contains this")
    ap.add_argument("--setup-peers", action="store_true",
                    help="create the peers' virtual environment (BUILD/peers-venv: torch, jax[cpu]) if missing")
    ap.add_argument("--no-peers", action="store_true", help="gradc alone")
    ap.add_argument("--gemm-lib", action="store_true", help="also every GEMM provider, and the epilogues")
    ap.add_argument("--gemm-lib-only", action="store_true", help="only the provider comparison")
    ap.add_argument("--precision", default="f32",
                    help="gradc's precisions, comma-separated (f32, bf16, f16): each beyond f32 is a gradc run "
                         "of its own, compared with gradc f32 in a table of its own")
    ap.add_argument("--loss-curve", type=int, metavar="STEPS",
                    help="train the demo's model STEPS steps in f32 and bf16 and compare the loss curves")
    ap.add_argument("--no-steps", action="store_true", help="no step tables (with --loss-curve: the curve alone)")
    ap.add_argument("--results")
    return ap.parse_args()


def venv_dir(a):
    return os.path.join(os.path.dirname(os.path.abspath(a.gradc)), "peers-venv")


def setup_peers(a):
    """BUILD/peers-venv with current torch and jax[cpu] from PyPI (kept once made)."""
    v = venv_dir(a)
    py = os.path.join(v, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", "import torch, jax"], capture_output=True).returncode == 0:
        return
    print(f"run.py: setting up {v} (torch, jax[cpu] from PyPI; a large download)", file=sys.stderr)
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", v], check=True)
    if subprocess.run([py, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        subprocess.run([py, "-m", "ensurepip", "--upgrade"], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", "torch", "jax[cpu]", "numpy"], check=True)


def peers_python(a):
    py = os.path.join(venv_dir(a), "bin", "python")
    return py if os.path.exists(py) else None


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


def pin(threads):
    """taskset prefix: the cell's processes on CPUs 0..threads-1."""
    return ["taskset", "-c", ",".join(str(c) for c in range(threads))]


def last_line(err, rc):
    return err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"


def run_gradc(a, model, defs, threads, steps, cache, gemm=None, precision=None):
    cmd = pin(threads) + [a.gradc, "bench", model_path(model)] + defs_args(defs) + [
        "--threads", str(threads), "--steps", str(steps), "--warmup", str(a.warmup), "--target", a.target,
        "--json"] + (["--precision", precision] if precision else [])
    env = dict(os.environ, GRADC_CACHE_DIR=cache)
    env.pop("GRADC_GEMM", None)
    if gemm:
        env["GRADC_GEMM"] = gemm
    rc, out, err = sh(cmd, env)
    if rc != 0:
        return None, last_line(err, rc)
    return json.loads(out), None


def run_torch(a, model, defs, threads, steps, compiled=False, autocast=None):
    py = peers_python(a) or PY
    cmd = pin(threads) + [py, os.path.join(ROOT, "bench", "torch_models.py"), model] + defs_args(defs) + [
        "--threads", str(threads), "--steps", str(steps), "--warmup", str(a.warmup)] + (
        ["--compile"] if compiled else []) + (["--autocast", autocast] if autocast else [])
    rc, out, err = sh(cmd)
    if rc != 0:
        return None, last_line(err, rc)
    return json.loads(out.strip().splitlines()[-1]), None


def run_jax(a, model, defs, threads, steps):
    py = peers_python(a)
    if not py:
        return None, "no peers venv"
    env = dict(os.environ)
    if threads == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    cmd = pin(threads) + [py, os.path.join(ROOT, "bench", "jax_models.py"), model] + defs_args(defs) + [
        "--threads", str(threads), "--steps", str(steps), "--warmup", str(a.warmup)]
    rc, out, err = sh(cmd, env)
    if rc != 0:
        return None, last_line(err, rc)
    return json.loads(out.strip().splitlines()[-1]), None


def mb(x):
    return f"{x / 2**20:.0f}"


def ratio(x, y):
    return f"{x / y:.2f}" if y else "-"


TARGET = {"tinygpt large": 0.8, "tinygpt small": 0.6, "mlp": 0.8, "mlp2": 0.8}


def step_table(rows, best_floor):
    """rows: (name, thr, {who: (fig, err)}); best_floor: (name, thr) -> (ms, provider)."""
    lines = [
        "| model | thr | gradc step ms (med/min) | provider | floor ms own / best (provider) | step/best floor "
        "| torch eager ms (its GEMM floor) | torch.compile ms | jax jit ms | gradc / best torch (target) "
        "| RSS MB gradc / torch | cold compile ms gradc / torch.compile / jax |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def med(f):
        return f"{f[0]['step_ms_median']:.2f}" if f and f[0] else (f"failed: {f[1]}" if f else "-")

    for name, thr, r in rows:
        g = r.get("gradc", (None, None))[0]
        if not g:
            lines.append(f"| {name} | {thr} | failed: {r.get('gradc', (None, '?'))[1]} |" + " |" * 10)
            continue
        bf, bprov = min(best_floor.get((name, thr), (g["gemm_floor_ms"], g["gemm_provider"])),
                        (g["gemm_floor_ms"], g["gemm_provider"]))
        eager, comp, jx = r.get("eager"), r.get("compile"), r.get("jax")
        torch_best = [f[0]["step_ms_median"] for f in (eager, comp) if f and f[0]]
        vs = f"{g['step_ms_median'] / min(torch_best):.2f} ({TARGET.get(name, '-')})" if torch_best else "-"
        rss_t = mb(eager[0]["peak_rss_bytes"]) if eager and eager[0] else "-"
        cc = [f"{g['compile_ms']:.0f}",
              f"{comp[0]['compile_ms']:.0f}" if comp and comp[0] else "-",
              f"{jx[0]['compile_ms']:.0f}" if jx and jx[0] else "-"]
        lines.append("| " + " | ".join([
            name, str(thr), f"{g['step_ms_median']:.2f} / {g['step_ms_min']:.2f}", g["gemm_provider"],
            f"{g['gemm_floor_ms']:.2f} / {bf:.2f} ({bprov})", ratio(g["step_ms_median"], bf),
            med(eager) + (f" ({eager[0]['gemm_floor_ms']:.2f})" if eager and eager[0] and eager[0].get("gemm_floor_ms")
                          else ""),
            med(comp), med(jx), vs, f"{mb(g['peak_rss_bytes'])} / {rss_t}", " / ".join(cc)]) + " |")
    return "\n".join(lines)


PROVIDERS = ["onednn", "openblas", "blis"]


def provider_table(prov_rows):
    """prov_rows: (name, thr, {provider: (fig, err)}, choice)."""
    lines = ["| model | thr | host's choice | " + " | ".join(f"{p} step / floor ms" for p in PROVIDERS) + " |",
             "|---|---|---|" + "---|" * len(PROVIDERS)]
    for name, thr, res, choice in prov_rows:
        cells = [name, str(thr), choice]
        for p in PROVIDERS:
            f, err = res.get(p, (None, "not run"))
            cells.append(f"{f['step_ms_median']:.2f} / {f['gemm_floor_ms']:.2f}" if f else f"failed: {err}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def epilogue_table(a, threads_list):
    """bench/gemm_epilogue.c at each thread count: a fused epilogue against a second pass."""
    build = os.path.dirname(os.path.abspath(a.gradc))
    rc, _, err = sh(["cmake", "--build", build, "--target", "gemm_epilogue"])
    exe = os.path.join(build, "gemm_epilogue")
    if rc != 0 or not os.path.exists(exe):
        return f"(gemm_epilogue did not build: {last_line(err, rc)})"
    lines = ["| thr | provider | M N K | epilogue | GEMM alone ms | fused ms | GEMM + second pass ms "
             "| fused saves ms |", "|---|---|---|---|---|---|---|---|"]
    for thr in threads_list:
        wait_quiet(a)
        rc, out, err = sh(pin(thr) + [exe, str(thr)])
        for l in out.splitlines():
            f = l.split()
            if l.startswith("#") or len(f) < 8:
                continue
            try:
                saves = f"{float(f[7]) - float(f[6]):.3f}"
            except ValueError:
                lines.append(f"| {thr} | {f[0]} | {' '.join(f[1:4])} | {' '.join(f[4:])} | | | | |")
                continue
            note = " ".join(f[8:])
            lines.append(f"| {thr} | {f[0]} | {f[1]} {f[2]} {f[3]} | {f[4]}{' ' + note if note else ''} | {f[5]} "
                         f"| {f[6]} | {f[7]} | {saves} |")
    return "\n".join(lines)


def precision_table(rows, precisions):
    """gradc at each precision against gradc f32: median (min) ms and the ratio of medians; for bf16
    also PyTorch's autocast bf16 (eager and torch.compile) and gradc bf16 against the faster."""
    bf = "bf16" in precisions
    head = "| config | threads | gradc f32 | " + " | ".join(
        f"gradc {p} | {p} / f32 (target{' 0.5' if p == 'bf16' else ''})" for p in precisions) + " |"
    if bf:
        head += " torch autocast bf16 eager | torch autocast bf16 compile | gradc bf16 / best torch bf16 (0.8) |"
    out = [head, "|" + " --- |" * (3 + 2 * len(precisions) + (3 if bf else 0))]

    def cell(f):
        return f"{f['step_ms_median']:.1f} ({f['step_ms_min']:.1f})" if f else "-"

    for name, thr, res in rows:
        f32 = res.get("gradc", (None, None))[0]
        cells = [name, str(thr), cell(f32)]
        for p in precisions:
            f = res.get("gradc-" + p, (None, None))[0]
            cells.append(cell(f))
            cells.append(ratio(f["step_ms_median"], f32["step_ms_median"]) if f and f32 else "-")
        if bf:
            g = res.get("gradc-bf16", (None, None))[0]
            peers = [res.get(w, (None, None)) for w in ("eager-bf16", "compile-bf16")]
            cells += [cell(f) if f else (f"failed: {e}" if e else "-") for f, e in peers]
            t = [f["step_ms_median"] for f, _ in peers if f]
            cells.append(ratio(g["step_ms_median"], min(t)) if g and t else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def loss_curve(a, steps):
    """The demo's training (tools/demo.sh's model, data and flags) for `steps` steps in f32 and bf16:
    a markdown table of both losses at every tenth of the run, the validation loss at the end, and the
    gap of the last 50 steps' mean loss (the runs see the same batches in the same order)."""
    dims = ["-D", "V=256", "-D", "T=64", "-D", "C=96", "-D", "L=3"]
    logs = {}
    with tempfile.TemporaryDirectory(prefix="gradc-curve-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "wb") as f:
            for p in ["README.md"] + sorted(os.path.join("docs", d) for d in os.listdir(os.path.join(ROOT, "docs"))
                                            if d.endswith(".md")):
                f.write(open(os.path.join(ROOT, p), "rb").read())
        data, val = os.path.join(tmp, "corpus.safetensors"), os.path.join(tmp, "val.safetensors")
        for cmd in ([a.gradc, "data", "text", corpus, "-T", "64", "--stride", "16", "-o", data],
                    [a.gradc, "data", "text", os.path.join(ROOT, "python", "README.md"), "-T", "64", "-o", val]):
            rc, _, err = sh(cmd)
            if rc != 0:
                return f"(data text failed: {last_line(err, rc)})"
        for prec in ("f32", "bf16"):
            log = os.path.join(tmp, f"{prec}.csv")
            wait_quiet(a)
            t0 = time.time()
            rc, _, err = sh(pin(1) + [a.gradc, "train", model_path("tinygpt")] + dims + [
                "--gas", "2", "--threads", "1", "--data", data, "--steps", str(steps), "--lr", "3e-3",
                "--warmup", str(min(100, steps // 5)), "--cosine", "--min-lr", "3e-4", "--clip", "1", "--seed", "1",
                "--val-data", val, "--val-every", str(max(steps // 5, 1)), "--precision", prec, "--log", log])
            if rc != 0:
                return f"(train --precision {prec} failed: {last_line(err, rc)})"
            rows = [l.split(",") for l in open(log).read().splitlines()]
            logs[prec] = (rows[0], rows[1:], time.time() - t0)
    head, f32, _ = logs["f32"]
    _, bf16, _ = logs["bf16"]
    col = {h: i for i, h in enumerate(head)}

    def num(r, k):
        return float(r[col[k]]) if k in col and r[col[k]] not in ("", "nan") else None

    lines = ["| step | f32 total loss | bf16 total loss | bf16 / f32 - 1 |", "|---|---|---|---|"]
    marks = sorted({1} | {max(1, steps * k // 10) for k in range(1, 11)})
    for s in marks:
        x, y = num(f32[s - 1], "total"), num(bf16[s - 1], "total")
        lines.append(f"| {s} | {x:.4f} | {y:.4f} | {y / x - 1:+.2%} |")
    last = min(50, steps)
    mx = sum(num(r, "total") for r in f32[-last:]) / last
    my = sum(num(r, "total") for r in bf16[-last:]) / last
    vx, vy = num(f32[-1], "val_total"), num(bf16[-1], "val_total")
    lines.append("")
    lines.append(f"Mean total loss over the last {last} steps: f32 {mx:.4f}, bf16 {my:.4f}, gap {my / mx - 1:+.2%} "
                 f"(target: within 2%).  Validation loss at step {steps}: f32 {vx:.4f}, bf16 {vy:.4f}, gap "
                 f"{vy / vx - 1:+.2%}.  Wall time: f32 {logs['f32'][2]:.0f} s, bf16 {logs['bf16'][2]:.0f} s "
                 f"(train, 1 thread)." if vx and vy else
                 f"Mean total loss over the last {last} steps: f32 {mx:.4f}, bf16 {my:.4f}, gap {my / mx - 1:+.2%}.")
    return "\n".join(lines)


def machine():
    rc, out, _ = sh(["lscpu"])
    model = re.search(r"Model name:\s*(.*)", out)
    cpus = re.search(r"^CPU\(s\):\s*(\d+)", out, re.M)
    fam = re.search(r"CPU family:\s*(\d+)", out)
    mod = re.search(r"^Model:\s*(\d+)", out, re.M)
    flags = re.search(r"Flags:\s*(.*)", out)
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if flags and f in flags.group(1).split()]
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


def cpu_ticks():
    """(steal, all) ticks of every CPU so far (/proc/stat).  Steal is time a
    virtual CPU was ready but the hypervisor ran something else: other
    guests' work, which neither the load average nor --quiet-wait's busy
    count can tell apart from the run's own, slows a run down as much."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (f[7] if len(f) > 7 else 0), sum(f[:8])


class Steal:
    """The share of CPU time stolen during each run, and over all of them."""
    def __init__(self):
        self.stolen = self.total = 0
        self.worst = 0.0

    def run(self, fn, *args):
        s0, t0 = cpu_ticks()
        out = fn(*args)
        s1, t1 = cpu_ticks()
        share = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
        self.stolen, self.total = self.stolen + s1 - s0, self.total + t1 - t0
        self.worst = max(self.worst, share)
        return out, share

    def text(self):
        if not self.total:
            return ""
        return (f"CPU time stolen by the hypervisor during the runs (/proc/stat): "
                f"{100 * self.stolen / self.total:.1f}% (worst run {100 * self.worst:.1f}%).")


_tools = {}


def bench_tool(a, name):
    """The path of bench/NAME.c's program in the build directory, built (or
    brought up to date) once a run, or None where it does not build."""
    if name not in _tools:
        build = os.path.dirname(os.path.abspath(a.gradc))
        rc, _, _ = sh(["cmake", "--build", build, "--target", name])
        exe = os.path.join(build, name)
        _tools[name] = exe if rc == 0 and os.path.exists(exe) else None
    return _tools[name]


def fma_peak(a, threads_list):
    """bench/fma_peak.c at each thread count: (isa, [GFLOP/s a core at each]), or None."""
    exe = bench_tool(a, "fma_peak")
    if not exe:
        return None
    isa, per = "?", []
    for thr in threads_list:
        wait_quiet(a)
        rc, out, err = sh(pin(thr) + [exe, str(thr)])
        f = out.split()
        if rc != 0 or len(f) != 3:
            return None
        isa = f[0]
        per.append(f[1])
    return isa, per


def core_latency(a):
    """bench/core_latency.c on the first two CPUs: a cache line's round trip
    between them in ns, or None.  A VM's two CPUs sit on one die of the host
    or on two, and the host moves them: a two-thread step hands its rows
    from core to core and runs at one thread's speed across dies."""
    exe = bench_tool(a, "core_latency")
    if not exe:
        return None
    rc, out, _ = sh(pin(2) + [exe])
    f = out.split()
    return float(f[0]) if rc == 0 and len(f) == 3 else None


def latency_text(all_ns, kept):
    """The round trips of the multi-thread runs, and those of the runs the
    table keeps (gradc's and its peers')."""
    if not all_ns:
        return ""
    def span(v):
        return f"{min(v):.0f}-{max(v):.0f}" if v else "-"
    g = [ns for who, ns in kept if who == "gradc"]
    o = [ns for who, ns in kept if who != "gradc"]
    return (f"A cache line's round trip between the two cores (bench/core_latency.c; the larger of "
            f"the ones just before and just after each multi-thread run): {span(all_ns)} ns; in the runs "
            f"the table keeps, gradc's {span(g)}, "
            f"its peers' {span(o)} (some hosts move the two CPUs between one die and two: "
            f"about 55 against 330 ns on the AMD EPYC).")


def peak_text(threads_list, before, after):
    """What one core's FMAs sustained before and after the runs: the same CPU
    model runs at different speeds on different hosts, and one shared host
    at different speeds over a day (its neighbours, its clocks)."""
    if not before or not after:
        return ""
    def at(per):
        return ", ".join(f"{g} at {t} thread{'s' if t > 1 else ''}" for t, g in zip(threads_list, per))
    return (f"f32 FMA peak a core (bench/fma_peak.c, {before[0]}, GFLOP/s): {at(before[1])} before the runs; "
            f"{at(after[1])} after.")


def replace_section(text, tag, body):
    begin, end = f"<!-- run.py:{tag} -->", f"<!-- /run.py:{tag} -->"
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        return text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def main():
    a = parse()
    threads = [int(x) for x in a.threads.split(",")]
    load0 = load()
    a.gemm_lib = a.gemm_lib or a.gemm_lib_only
    if a.setup_peers:
        setup_peers(a)
    peers = [] if a.no_peers or a.gemm_lib_only else (
        ["eager", "compile", "jax"] if peers_python(a) else ["eager"])
    low = [p for p in a.precision.split(",") if p and p != "f32"]
    configs = [(name, model, defs, a.steps or steps) for name, model, defs, steps in CONFIGS
               if not (a.only and a.only not in name) and not a.no_steps]
    cells = [(name, model, defs, steps, thr) for name, model, defs, steps in configs for thr in threads]
    peak0 = fma_peak(a, threads) if cells else None
    steal = Steal()
    selects = []    # gradc's gemm_select_ms, every run
    rtts = []       # core_latency around every multi-thread run
    best = {}       # cell -> who -> (fig, err)
    prov_best = {}  # cell -> provider -> (fig, err)
    with tempfile.TemporaryDirectory(prefix="gradc-bench-") as tmp:
        # Rounds over every cell rather than repeats of one cell in a row: a
        # disturbance of this shared machine lasts minutes, and would spoil
        # every repeat of the one cell it falls on.
        for r in range(a.repeat):
            for i, (name, model, defs, steps, thr) in enumerate(cells):
                runs = ([] if a.gemm_lib_only else [("gradc", None)] + [("gradc-" + p, None) for p in low]) + [
                    (p, None) for p in peers] + [(p + "-bf16", None) for p in peers
                                                 if "bf16" in low and p in ("eager", "compile")]
                if a.gemm_lib:
                    runs += [("gemm:" + p, p) for p in PROVIDERS]
                for who, gemm in runs:
                    wait_quiet(a)
                    rtt = core_latency(a) if thr > 1 else None
                    # A fresh cache each time: cold, then warm from what the cold run wrote
                    # (and the host's GEMM provider measured afresh).
                    cache = os.path.join(tmp, f"cache-{model}-{i}-{r}-{who}")
                    if who == "gradc" or gemm:
                        (fig, err), stolen = steal.run(run_gradc, a, model, defs, thr, steps, cache, gemm)
                        mins = GRADC_MINS
                    elif who.startswith("gradc-"):
                        (fig, err), stolen = steal.run(run_gradc, a, model, defs, thr, steps, cache, None,
                                                       who[len("gradc-"):])
                        mins = GRADC_MINS
                    elif who == "jax":
                        (fig, err), stolen = steal.run(run_jax, a, model, defs, thr, steps)
                        mins = ("compile_ms",)
                    else:
                        kind, _, ac = who.partition("-")
                        (fig, err), stolen = steal.run(run_torch, a, model, defs, thr, steps, kind == "compile",
                                                       ac or None)
                        mins = ("compile_ms",) if kind == "compile" else ("gemm_floor_ms",)
                    # The host can move the CPUs within a run: the worse of before and after.
                    after = core_latency(a) if rtt is not None else None
                    rtt = max(rtt, after) if after is not None else None
                    if rtt is not None:
                        rtts.append(rtt)
                    if fig and rtt is not None:
                        fig["core_rtt_ns"] = rtt
                    if fig and who.startswith("gradc") and "gemm_select_ms" in fig:
                        selects.append(fig["gemm_select_ms"])
                    table = prov_best.setdefault(i, {}) if gemm else best.setdefault(i, {})
                    key = gemm or who
                    old = table.get(key, (None, None))[0]
                    new = fastest(old, fig, mins) if fig else old
                    table[key] = (new, None if new else err)
                    print(f"round {r + 1}: {name} threads={thr} {who}: {fig or err} (steal {100 * stolen:.1f}%"
                          + (f", core round trip {rtt:.0f} ns" if rtt is not None else "") + ")", file=sys.stderr)
        rows = [(name, thr, best.get(i, {})) for i, (name, model, defs, steps, thr) in enumerate(cells)]
        best_floor, prov_rows = {}, []
        for i, (name, model, defs, steps, thr) in enumerate(cells):
            res = prov_best.get(i, {})
            floors = [(f["gemm_floor_ms"], p) for p, (f, _) in res.items() if f]
            if floors:
                best_floor[(name, thr)] = min(floors)
            g = best.get(i, {}).get("gradc", (None, None))[0]
            if a.gemm_lib:
                prov_rows.append((name, thr, res, g["gemm_provider"] if g else "-"))
        table = step_table(rows, best_floor) if not a.gemm_lib_only and rows else None
        if table:
            print(table)
        prec_table = precision_table(rows, low) if low and not a.gemm_lib_only and rows else None
        if prec_table:
            print()
            print(prec_table)
        lib_table = epi = None
        if a.gemm_lib:
            lib_table = provider_table(prov_rows)
            epi = epilogue_table(a, threads)
            print()
            print(lib_table)
            print()
            print(epi)
    peak1 = fma_peak(a, threads) if cells else None
    select = (f"gradc's GEMM provider measurement (gemm_select_ms, once a host; outside the cold compile): "
              f"{min(selects):.0f}-{max(selects):.0f} ms." if selects else "")
    kept = [(who, f["core_rtt_ns"]) for res in best.values() for who, (f, _) in res.items()
            if f and "core_rtt_ns" in f and who in ("gradc", "eager", "compile", "jax")]
    conditions = " ".join(x for x in (peak_text(threads, peak0, peak1), steal.text(), select,
                                      latency_text(rtts, kept)) if x)
    if conditions:
        print("\n" + conditions)
    curve = loss_curve(a, a.loss_curve) if a.loss_curve else None
    if curve:
        print()
        print(curve)
    if a.results:
        cpu, date = machine()
        cmd = "bench/run.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
        text = open(a.results).read() if os.path.exists(a.results) else "# Benchmarks\n"
        versions = []
        for who, field in (("eager", "torch"), ("jax", "jax")):
            f = next((best[i][who][0] for i in best if best[i].get(who, (None,))[0]), None)
            if f:
                versions.append(f"{field} {f[field]}")
        windows = ", ".join(f"{steps} for {name}" for name, _, _, steps in configs) or "none"
        head = (f"Machine: {cpu}.  Date: {date}.  Command: `{cmd}` "
                f"(timed windows: {windows}; each after {a.warmup} warm-up, target {a.target}; best of {a.repeat} "
                f"runs per cell, in rounds over all cells).  Peers: {', '.join(versions) or 'none'}.  "
                f"Load average before / after: {load0} / {load()}." + (" " + conditions if conditions else ""))
        if table:
            text = replace_section(text, "steps", head + "\n\n" + table)
        if prec_table:
            text = replace_section(text, "precision", head + "\n\n" + prec_table)
        if curve:
            text = replace_section(text, "loss-curve", f"Machine: {cpu}.  Date: {date}.  Command: `{cmd}`.\n\n"
                                   + curve)
        if lib_table:
            text = replace_section(text, "gemm-lib", head + "\n\n" + lib_table + "\n\nFused epilogues "
                                   "(bench/gemm_epilogue.c, tinygpt large's shapes):\n\n" + epi)
        with open(a.results, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The slow-link benchmark of data parallelism: how much of the gradient
reduction the overlap passes (dp-reduce buckets, schedule) hide behind the
backward, on 2 MPI ranks whose link the comm layer slows down.

For each mode (overlap on, then --no-overlap) it runs

  mpirun -np 2 gradc run tinygpt.gdl -D ... --dp 2 --trace T.json \\
         --link-latency-us L --link-gbps G [--bucket-mb X] [--no-overlap]

R times, reads each run's Chrome trace (every rank's events; pid = rank)
and sums, per rank, over the gradient reductions (the dp group's
collectives; the step layer's "window.sum" and "loss" reductions are not
gradients; the comm layer names them by their tags):

  in flight   time from each collective's start to its completion
  exposed     time the rank sat blocked waiting for them
  model       what the simulated link charges for them: latency +
              bytes / bandwidth each (a ring all-reduce moves 2 (N-1)/N of
              the buffer, all-gather / reduce-scatter (N-1)/N of the whole)

and prints the medians over the runs of each mode, for the rank that
waited least in each run (its wait is the link's alone: the other ranks
were ready before it) and for the one that waited most (its wait adds the
time it waited for a rank whose compute ran late, which a busy machine
causes), and from them

  hidden       1 - exposed(overlap) / exposed(no overlap): the share of the
               reduction time a rank waits for without overlap that overlap
               hides (the target is >= 80%)
  hidden/model 1 - exposed(overlap) / model

A bucket is one all-reduce per contiguous run of its gradient buffers
(dp-reduce reduces a stacked param's gradient one layer slice at a time,
and slices of different params are not contiguous), so "reductions"
counts those.  The comm layer's simulated link queues a group's
collectives one after another (a transfer begins when the previous one on
the link ends), so a bucket of several all-reduces takes the sum of their
modelled times, as in the compile-time cost model (gradc compile
--cost-report).

The link defaults are chosen so that the reduction time is comparable to
the backward's compute on this machine; --link-gbps and --link-latency-us
change it.  --model small runs a smaller tinygpt (seconds); --model large is
the "tinygpt large" of bench/run.py.

Usage: bench/dp_overlap.py [--gradc build/gradc] [--model large|small] [--repeat 3]
                           [--link-latency-us 50] [--link-gbps 4] [--bucket-mb 1] [--gas 1]
                           [--keep DIR] [--json]
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np"]

MODELS = {
    # bench/run.py's "tinygpt large" and "tinygpt small".
    "large": ["B=16", "T=128", "C=256", "L=4", "NH=4", "V=96"],
    "small": ["B=8", "T=32", "C=64", "L=2"],
}

NAME = re.compile(r"^(?:wait )?(all_reduce|all_gather|reduce_scatter|broadcast|barrier) (\w+) (\w+)\[(\d+)\](?: (.*))?$")


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gradc", default=os.path.join(ROOT, "build", "gradc"))
    ap.add_argument("--model", default="large", help="large, small, or -D values as N=V,N=V,...")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-latency-us", type=float, default=50.0)
    ap.add_argument("--link-gbps", type=float, default=4.0)
    ap.add_argument("--bucket-mb", type=float, default=None)
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--keep", help="keep the traces in this directory")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    return ap.parse_args()


def sh(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def defs_args(defs):
    out = []
    for d in defs:
        out += ["-D", d]
    return out


def link_us(kind, ranks, dtype, count, lat, gbps):
    """The simulated link's time of one collective (runtime/comm.c's comm_link_us)."""
    if ranks <= 1:
        return 0.0
    size = {"f32": 4, "f64": 8, "u64": 8}[dtype]
    buf = count * size
    moved = {"all_reduce": 2.0 * (ranks - 1) / ranks * buf, "all_gather": (ranks - 1) * buf,
             "reduce_scatter": (ranks - 1) * buf, "broadcast": buf, "barrier": 0.0}[kind]
    return lat + (moved / (gbps * 125.0) if gbps > 0 else 0.0)


def is_grad(group, dtype, what):
    return group == "dp" and what not in ("window.sum", "loss")


def read_trace(paths):
    """Every X event of the trace files (rank 0's holds all ranks' when the
    runtime gathers them; else one file per rank)."""
    events, seen = [], set()
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for e in doc.get("traceEvents", []):
            if e.get("ph") != "X":
                continue
            key = (e["pid"], e["tid"], e["name"], e["ts"], e["dur"])
            if key in seen:
                continue
            seen.add(key)
            events.append(e)
    return events


def figures(events, a):
    """Per rank: gradient reductions in flight, exposed, modelled (us);
    their count; compute time; the trace's extent."""
    per = {}
    for e in events:
        r = per.setdefault(e["pid"], {"inflight_us": 0.0, "exposed_us": 0.0, "model_us": 0.0, "reductions": 0,
                                      "compute_us": 0.0, "other_exposed_us": 0.0, "t0": e["ts"], "t1": e["ts"]})
        r["t0"] = min(r["t0"], e["ts"])
        r["t1"] = max(r["t1"], e["ts"] + e["dur"])
        cat = e.get("cat", "")
        if cat == "compute":
            r["compute_us"] += e["dur"]
            continue
        m = NAME.match(e["name"])
        if not m or cat not in ("comm", "exposed"):
            continue
        kind, group, dtype, count, what = m.group(1), m.group(2), m.group(3), int(m.group(4)), m.group(5) or ""
        if not is_grad(group, dtype, what):
            if cat == "exposed":
                r["other_exposed_us"] += e["dur"]
            continue
        if cat == "exposed":
            r["exposed_us"] += e["dur"]
        else:
            r["inflight_us"] += e["dur"]
            r["reductions"] += 1
            r["model_us"] += link_us(kind, a.ranks, dtype, count, a.link_latency_us, a.link_gbps)
    for r in per.values():
        r["span_us"] = r.pop("t1") - r.pop("t0")
    return per


def run_once(a, model, defs, files, mode, i, tmp):
    trace = os.path.join(tmp, f"{mode}-{i}.json")
    for old in glob.glob(trace[:-5] + "*"):
        os.remove(old)
    cmd = MPIRUN + [str(a.ranks), a.gradc, "run", model] + defs_args(defs) + [
        "--dp", str(a.ranks), "--gas", str(a.gas), "--target", a.target, "--threads", str(a.threads),
        "--params", files["params"], "--inputs", files["inputs"], "--trace", trace,
        "--link-latency-us", str(a.link_latency_us), "--link-gbps", str(a.link_gbps)]
    if a.bucket_mb is not None:
        cmd += ["--bucket-mb", str(a.bucket_mb)]
    if mode == "no-overlap":
        cmd.append("--no-overlap")
    t = time.time()
    rc, out, err = sh(cmd, dict(os.environ, GRADC_CACHE_DIR=os.path.join(tmp, "cache")))
    wall = time.time() - t
    if rc != 0:
        sys.exit(f"dp_overlap.py: {' '.join(cmd)} failed ({rc}):\n{err.strip() or out.strip()}")
    paths = sorted(glob.glob(trace[:-5] + "*.json"))
    if not paths:
        sys.exit(f"dp_overlap.py: the run wrote no trace ({trace}); does this gradc support --trace?\n{err}")
    per = figures(read_trace(paths), a)
    if not per or not any(r["reductions"] for r in per.values()):
        sys.exit(f"dp_overlap.py: no gradient reduction in the trace {paths}")
    loss = re.search(r"loss total (\S+)", out)
    return {"wall_s": wall, "ranks": per, "loss": float(loss.group(1)) if loss else None, "stdout": out}


def worst_rank(run):
    return max(run["ranks"].values(), key=lambda r: r["exposed_us"])


def best_rank(run):
    return min(run["ranks"].values(), key=lambda r: r["exposed_us"])


def main():
    a = parse()
    if not os.path.exists(a.gradc):
        sys.exit(f"dp_overlap.py: no {a.gradc} (build it, or pass --gradc)")
    if shutil.which("mpirun") is None:
        sys.exit("dp_overlap.py: mpirun is not installed (Debian: openmpi-bin)")
    defs = MODELS.get(a.model, a.model.split(","))
    model = os.path.join(ROOT, "examples", "tinygpt.gdl")
    tmp = a.keep or tempfile.mkdtemp(prefix="gradc-dp-overlap-")
    os.makedirs(tmp, exist_ok=True)
    files = {"params": os.path.join(tmp, "params.safetensors"), "inputs": os.path.join(tmp, "batch.safetensors")}
    for cmd in ([a.gradc, "init", model] + defs_args(defs) + ["-o", files["params"], "--seed", "1"],
                [a.gradc, "data", "random", model] + defs_args(defs) + ["-o", files["inputs"], "--seed", "2"]):
        rc, out, err = sh(cmd)
        if rc != 0:
            sys.exit(f"dp_overlap.py: {' '.join(cmd)} failed:\n{err}")
    runs = {"overlap": [], "no-overlap": []}
    # Alternate the modes so a busy machine slows both alike; one warm-up
    # run each fills the compile cache.
    for mode in runs:
        run_once(a, model, defs, files, mode, "warm", tmp)
    for i in range(a.repeat):
        for mode in runs:
            runs[mode].append(run_once(a, model, defs, files, mode, i, tmp))
    # Per run, the rank that waited least and the one that waited most: a
    # rank whose compute ran late (a busy machine) never waits for the
    # others, so its wait is the link's alone; the other rank's adds the
    # time it waited for the late one.
    def med(mode, pick):
        xs = sorted(runs[mode], key=lambda r: pick(r)["exposed_us"])
        return xs[len(xs) // 2], pick(xs[len(xs) // 2])

    losses = {r["loss"] for rs in runs.values() for r in rs}
    if len(losses) > 1:
        print(f"warning: the losses differ between runs: {sorted(losses)}", file=sys.stderr)
    print(f"tinygpt {' '.join(defs)}, {a.ranks} ranks x {a.threads} thread(s), K={a.gas}, "
          f"link {a.link_latency_us:g} us + {a.link_gbps:g} Gb/s"
          + (f", buckets {a.bucket_mb:g} MiB" if a.bucket_mb is not None else "")
          + f"; medians of {a.repeat} runs")
    print()
    print("| mode | rank | reductions | modelled ms | in flight ms | exposed ms | compute ms | other exposed ms | run s |")
    print("|---|---|---|---|---|---|---|---|---|")
    result = {}
    for mode in runs:
        for label, pick in (("least waiting", best_rank), ("most waiting", worst_rank)):
            run, r = med(mode, pick)
            result[(mode, label)] = r
            print(f"| {mode} | {label} | {r['reductions']} | {r['model_us'] / 1e3:.2f} | {r['inflight_us'] / 1e3:.2f} | "
                  f"{r['exposed_us'] / 1e3:.2f} | {r['compute_us'] / 1e3:.2f} | {r['other_exposed_us'] / 1e3:.2f} | "
                  f"{run['wall_s']:.2f} |")
    print()
    hidden = {}
    for label in ("least waiting", "most waiting"):
        on, off = result[("overlap", label)], result[("no-overlap", label)]
        h = 1 - on["exposed_us"] / off["exposed_us"] if off["exposed_us"] > 0 else float("nan")
        hm = 1 - on["exposed_us"] / on["model_us"] if on["model_us"] > 0 else float("nan")
        hidden[label] = (h, hm)
        print(f"gradient-reduction time hidden ({label} rank): {100 * h:.1f}% (1 - exposed with overlap / "
              f"without), {100 * hm:.1f}% of the link's modelled time (target >= 80%)")
    print("every run's exposed ms, least / most waiting rank: overlap "
          + " ".join(f"{best_rank(r)['exposed_us'] / 1e3:.1f}/{worst_rank(r)['exposed_us'] / 1e3:.1f}"
                     for r in runs["overlap"])
          + "; no-overlap " + " ".join(f"{best_rank(r)['exposed_us'] / 1e3:.1f}/{worst_rank(r)['exposed_us'] / 1e3:.1f}"
                                       for r in runs["no-overlap"]))
    if a.json:
        print(json.dumps({"hidden": hidden, "runs": {m: [{k: v for k, v in r.items() if k != "stdout"} for r in rs]
                                                     for m, rs in runs.items()}}, indent=1))
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""gradc against Hugging Face's GPT2LMHeadModel (ctest: hf_gpt2).

The references in this folder come from transformers and torch (make_ref.py,
run by hand; see README.md); this test needs only NumPy and the gradc
binary.  It converts the Hugging Face checkpoint model/model.safetensors with
examples/gpt2.map (`gradc convert --model examples/gpt2.gdl`, the dims read
from model/config.json as a user would), runs examples/gpt2.gdl on
inputs.safetensors at --gas 1 and 4 on the cpu and ref targets, and compares
the logits (`output logits`), the loss and every gradient with
ref.safetensors.

Relative error of a tensor: max|gradc - hf| / max|hf| over its elements
(for the loss, |gradc - hf| / |hf|).  The reference gradients are under
Hugging Face's names; this test stacks them per layer by reading the map
itself (not through gradc convert), so a converter bug cannot cancel out.
Tolerances: 1e-4 for examples/gpt2.gdl (f32 against Hugging Face run in
float64), and 1e-6 for the same model with every param made f64 (the
references are stored as F32, a rounding of 6e-8; f64 shows that what is left
at f32 is rounding, not a different formula).

Also: a window shorter than the positions (T = 16 < P = 32) against
Hugging Face's first 16 positions, and --dp 2 under mpirun where there is
one.  A file saved from GPT2Model (the hub's checkpoints: no "transformer."
prefix, attn.bias buffers) converts once the map drops the prefix, as its
header says, and convert's error names the prefix.

Then mutants: the same model with one plausible misreading of Hugging Face's
GPT-2 (erf gelu, no attention scaling, q and k swapped, ...) must miss
the tolerance, so the test can tell each of them apart.

    GRADC_BIN=build/gradc GRADC_SOURCE_DIR=. python3 tests/hf/check.py
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("GRADC_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradc  # noqa: E402  (read_safetensors only)

GRADC = os.environ.get("GRADC_BIN", os.path.join(SRC, "build", "gradc"))
HERE = os.path.join(SRC, "tests", "hf")
GDL = os.path.join(SRC, "examples", "gpt2.gdl")
MAP = os.path.join(SRC, "examples", "gpt2.map")
TOL = {"f32": 1e-4, "f64": 1e-6}

# (name, what it misreads, text replaced in examples/gpt2.gdl, replacement)
MUTANTS = [
    ("gelu_erf", "gelu without the tanh approximation (HF's gelu_new is tanh)",
     "gelu(x @ fc_w[l] + fc_b[l])", 'gelu(x @ fc_w[l] + fc_b[l], approximate="none")'),
    ("no_scale", "attention scores not scaled by 1/sqrt(head width)", " * rsqrt(HD)", ""),
    ("qkv_order", "c_attn split as k, q, v", "q = heads(qkv[..., 0:C])\n    k = heads(qkv[..., C:2*C])",
     "k = heads(qkv[..., 0:C])\n    q = heads(qkv[..., C:2*C])"),
    ("post_norm", "the last layer's MLP reads its input without ln_2",
     "x = x + mlp(layer_norm(x, ln2_w[l], ln2_b[l]), l)",
     "if l == L - 1 { x = x + mlp(x, l) } else { x = x + mlp(layer_norm(x, ln2_w[l], ln2_b[l]), l) }"),
    ("ln_eps", "layer_norm eps 1e-3 instead of 1e-5 at ln_f", "layer_norm(x, lnf_w, lnf_b)",
     "layer_norm(x, lnf_w, lnf_b, eps=1e-3)"),
]
# The same for examples/gpt2.map: square weights pass convert's shape check
# either way round, so only the numbers tell a wrong `transpose`.
MAP_MUTANTS = [
    ("proj_T", "attn.c_proj read as torch.nn.Linear's [out, in]", "attn.c_proj.weight", "attn.c_proj.weight transpose"),
]


def cli(*args, launch=()):
    p = subprocess.run(list(launch) + [GRADC] + [str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("hf_gpt2: gradc %s: exit %d\n%s%s" % (" ".join(map(str, args)), p.returncode, p.stdout, p.stderr))
    return p.stdout


def load(path):
    d = gradc.read_safetensors(path)
    d.pop("__metadata__", None)
    return d


def read_map(path):
    """(dest, source) per line of the map, as tools/convert.c reads it."""
    lines = []
    for text in open(path):
        tok = text.split("#")[0].split()
        if tok:
            assert len(tok) == 3 and tok[1] == "<-", "the test reads `DEST <- SOURCE` lines only: %r" % text
            lines.append((tok[0], tok[2]))
    return lines


def mean_ce(logits, targets):
    """Cross-entropy in float64, the mean over the targets that are not -100."""
    z = logits.astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    nll = lse - np.take_along_axis(z, np.maximum(targets, 0)[..., None], -1)[..., 0]
    scored = targets != -100
    return float((nll * scored).sum() / scored.sum())


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


class Ref:
    def __init__(self):
        cfg = json.load(open(os.path.join(HERE, "model", "config.json")))
        self.defs = {"V": cfg["vocab_size"], "P": cfg["n_positions"], "C": cfg["n_embd"], "NH": cfg["n_head"],
                     "L": cfg["n_layer"]}
        # What examples/gpt2.gdl spells out (F = 4 * C, eps 1e-5, tanh gelu, 1/sqrt(HD), tied head).
        want = {"activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True}
        assert all(cfg.get(k) == v for k, v in want.items()) and cfg.get("n_inner") in (None, 4 * cfg["n_embd"]), cfg
        ref = load(os.path.join(HERE, "ref.safetensors"))
        inputs = load(os.path.join(HERE, "inputs.safetensors"))
        self.defs["B"], self.defs["T"] = inputs["tokens"].shape
        self.logits, self.loss = ref.pop("logits"), float(ref.pop("loss"))
        # Every Hugging Face parameter is named by exactly one map line (a
        # layer's once per l); the gradients stacked as the map stacks them.
        hf = {k[len("grad."):]: v for k, v in ref.items()}
        self.grads, used = {}, set()
        for dest, src in read_map(MAP):
            if "{l}" in src:
                names = [src.replace("{l}", str(l)) for l in range(self.defs["L"])]
                self.grads[dest] = np.stack([hf[n] for n in names])
            else:
                names = [src]
                self.grads[dest] = hf[src]
            assert not used & set(names), "mapped twice: %s" % (used & set(names))
            used |= set(names)
        assert used == set(hf), "Hugging Face parameters no map line names: %s" % sorted(set(hf) - used)
        for name, g in self.grads.items():
            assert np.max(np.abs(g)) > 0, "reference gradient %s is zero" % name
        # The ignored targets matter at --gas 4 (one sample a micro-batch):
        # the loss is the mean over the window's scored positions, which the
        # mean of the per-sample means misses by far more than the tolerance.
        t = inputs["targets"]
        assert abs(mean_ce(self.logits, t) - self.loss) < 1e-6 * self.loss, "the references disagree"
        per_sample = np.mean([mean_ce(self.logits[b], t[b]) for b in range(len(t))])
        assert abs(per_sample - self.loss) > 1e-3 * self.loss, "the ignored targets do not tell the two means apart"

    def dflags(self):
        return ["-D%s=%d" % kv for kv in sorted(self.defs.items())]


def converted(ref, tmp, gdl=GDL, map_path=MAP):
    """The checkpoint converted for gdl with map_path (once per pair)."""
    params = os.path.join(tmp, "params.%s.%s.safetensors" % (os.path.basename(gdl), os.path.basename(map_path)))
    if not os.path.exists(params):
        cli("convert", os.path.join(HERE, "model", "model.safetensors"), "--map", map_path, "-o", params,
            "--model", gdl, *ref.dflags())
    return params


def errors(ref, tmp, gdl, gas, target, map_path=MAP, launch=(), extra=()):
    """{class: max relative error} and {param: relative error} of one run
    (launch: a prefix such as mpirun, extra: more run flags)."""
    params = converted(ref, tmp, gdl, map_path)
    grads, outs = os.path.join(tmp, "grads.safetensors"), os.path.join(tmp, "outputs.safetensors")
    stdout = cli("run", gdl, *ref.dflags(), "--gas", gas, "--target", target, "--params", params, *extra,
                 "--inputs", os.path.join(HERE, "inputs.safetensors"), "--grads-out", grads, "--outputs-out", outs,
                 launch=launch)
    loss = float(re.search(r"^loss ce (\S+)$", stdout, re.M).group(1))
    g, o = load(grads), load(outs)
    assert sorted(g) == sorted(ref.grads), "gradients: %s, expected %s" % (sorted(g), sorted(ref.grads))
    assert list(o) == ["logits"] and o["logits"].shape == ref.logits.shape, {k: v.shape for k, v in o.items()}
    per = {k: rel(g[k], ref.grads[k]) for k in sorted(ref.grads)}
    cls = {"logits": rel(o["logits"], ref.logits), "loss": abs(loss - ref.loss) / abs(ref.loss), "grads": max(per.values())}
    return cls, per


def shorter_window(ref, tmp):
    """T = 16 < P = 32 (wpe[0:T]): attention is causal, so the logits are
    Hugging Face's first 16 positions, and the loss is their mean
    cross-entropy over the scored targets (from the reference logits, in
    float64); wpe's rows from T on get no gradient."""
    inputs = load(os.path.join(HERE, "inputs.safetensors"))
    short = os.path.join(tmp, "inputs16.safetensors")
    gradc.write_safetensors(short, {k: v[:, :16].copy() for k, v in inputs.items()})
    defs = ["-D%s=%d" % kv for kv in sorted(dict(ref.defs, T=16).items())]
    params = converted(ref, tmp)
    grads, outs = os.path.join(tmp, "grads16.safetensors"), os.path.join(tmp, "outputs16.safetensors")
    worst = 0.0
    for gas in (1, 4):
        stdout = cli("run", GDL, *defs, "--gas", gas, "--params", params, "--inputs", short,
                     "--grads-out", grads, "--outputs-out", outs)
        loss = float(re.search(r"^loss ce (\S+)$", stdout, re.M).group(1))
        want = mean_ce(ref.logits[:, :16], inputs["targets"][:, :16])
        g = load(grads)
        assert np.all(g["wpe"][16:] == 0), "wpe rows from T on have a gradient"
        worst = max(worst, rel(load(outs)["logits"], ref.logits[:, :16]), abs(loss - want) / want)
    print("T=16 < P: logits and loss %.2e against Hugging Face's first 16 positions; wpe[16:] no gradient" % worst)
    return worst <= TOL["f32"]


def data_parallel(ref, tmp):
    """--dp 2 --gas 2 (two ranks of two micro-batches) against Hugging Face,
    where mpirun is installed and the build has MPI."""
    if not shutil.which("mpirun"):
        print("--dp 2: skipped: mpirun is not installed (Debian: openmpi-bin)")
        return True
    launch = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2"]
    params = converted(ref, tmp)
    p = subprocess.run(launch + [GRADC, "run", GDL, *ref.dflags(), "--dp", "2", "--params", params,
                                 "--inputs", os.path.join(HERE, "inputs.safetensors")], capture_output=True, text=True)
    if p.returncode != 0 and "this build has no MPI" in p.stdout + p.stderr:
        print("--dp 2: skipped: this build has no MPI (GRADC_MPI=OFF)")
        return True
    cls, _ = errors(ref, tmp, GDL, 2, "cpu", launch=launch, extra=["--dp", "2"])
    print("--dp 2 --gas 2: logits %.2e loss %.2e grads %.2e" % (cls["logits"], cls["loss"], cls["grads"]))
    return max(cls.values()) <= TOL["f32"]


def hub_checkpoint(ref, tmp):
    """A GPT2Model file (the hub's gpt2 checkpoints): no "transformer."
    prefix, and the attn.bias mask buffers.  gpt2.map names what to edit;
    edited as its header says, it gives the same params."""
    src = load(os.path.join(HERE, "model", "model.safetensors"))
    hub = {k[len("transformer."):]: v for k, v in src.items()}
    for l in range(ref.defs["L"]):
        hub["h.%d.attn.bias" % l] = np.tril(np.ones((1, 1, ref.defs["P"], ref.defs["P"]), np.float32))
    path, out = os.path.join(tmp, "hub.safetensors"), os.path.join(tmp, "hub.params.safetensors")
    gradc.write_safetensors(path, hub, {"format": "pt"})
    p = subprocess.run([GRADC, "convert", path, "--map", MAP, "-o", out, "--model", GDL] + ref.dflags(),
                       capture_output=True, text=True)
    want = "not in the file; the file has 'wte.weight' (drop the prefix 'transformer.' from the map's sources?)"
    assert p.returncode == 1 and want in p.stderr, p.stderr
    hub_map = os.path.join(tmp, "hub.map")
    with open(hub_map, "w") as f:
        f.write(open(MAP).read().replace("<- transformer.", "<- "))
    cli("convert", path, "--map", hub_map, "-o", out, "--model", GDL, *ref.dflags())
    a, b = load(out), load(converted(ref, tmp))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), "the hub file converts differently"
    print("hub-style GPT2Model file: gpt2.map names the prefix to drop; without it, the same params")


def mutant(ref, tmp, name, what, gdl=GDL, map_path=MAP):
    """One misreading at --gas 1 on the cpu target: True if some class misses the tolerance."""
    cls, _ = errors(ref, tmp, gdl, 1, "cpu", map_path)
    caught = max(cls.values()) > TOL["f32"]
    print("mutant %-10s logits %.1e loss %.1e grads %.1e  (%s)%s" % (name, cls["logits"], cls["loss"], cls["grads"],
                                                                 what, "" if caught else "  FAIL: not detected"))
    return caught


def main():
    ref = Ref()
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        f64 = os.path.join(tmp, "gpt2_f64.gdl")
        text = open(GDL).read()
        with open(f64, "w") as f:
            f.write(re.sub(r"(param\s+\w+\s*:\s*)f32\[", r"\1f64[", text))
        print("gradc against Hugging Face GPT2LMHeadModel (%s); relative error max|gradc - hf| / max|hf|"
              % ", ".join("%s=%d" % kv for kv in sorted(ref.defs.items())))
        print("%-5s %-3s %-3s %-10s %-10s %-10s %s" % ("model", "tgt", "K", "logits", "loss", "grads", "worst gradient"))
        for prec, gdl in (("f32", GDL), ("f64", f64)):
            for target in ("cpu", "ref"):
                for gas in (1, 4):
                    cls, per = errors(ref, tmp, gdl, gas, target)
                    worst = max(per, key=per.get)
                    bad = [k for k, v in list(cls.items()) + list(per.items()) if not v <= TOL[prec]]
                    print("%-5s %-3s %-3d %-10.2e %-10.2e %-10.2e %s %s" % (prec, target, gas, cls["logits"], cls["loss"],
                                                                    cls["grads"], worst, "FAIL " + ",".join(bad) if bad else ""))
                    if prec == "f32" and target == "cpu":
                        print("      " + " ".join("%s %.1e" % kv for kv in per.items()))
                    if bad:
                        failed.append("%s %s --gas %d: %s over %g" % (prec, target, gas, ", ".join(bad), TOL[prec]))
        if not shorter_window(ref, tmp):
            failed.append("T=16 over %g" % TOL["f32"])
        if not data_parallel(ref, tmp):
            failed.append("--dp 2 over %g" % TOL["f32"])
        hub_checkpoint(ref, tmp)
        # Each mutant must miss the f32 tolerance somewhere.
        for name, what, old, new in MUTANTS:
            assert text.count(old) == 1, "mutant %s: %r is not in examples/gpt2.gdl once" % (name, old)
            path = os.path.join(tmp, "gpt2_%s.gdl" % name)
            with open(path, "w") as f:
                f.write(text.replace(old, new))
            if not mutant(ref, tmp, name, what, gdl=path):
                failed.append("mutant %s (%s) is within the tolerance" % (name, what))
        maptext = open(MAP).read()
        for name, what, old, new in MAP_MUTANTS:
            assert maptext.count(old) == 1, "mutant %s: %r is not in examples/gpt2.map once" % (name, old)
            path = os.path.join(tmp, "gpt2_%s.map" % name)
            with open(path, "w") as f:
                f.write(maptext.replace(old, new))
            if not mutant(ref, tmp, name, what, map_path=path):
                failed.append("mutant %s (%s) is within the tolerance" % (name, what))
    if failed:
        sys.exit("hf_gpt2: FAILED\n  " + "\n  ".join(failed))
    print("hf_gpt2: ok")


if __name__ == "__main__":
    main()

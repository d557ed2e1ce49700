"""`gradc train`'s schedules and weight-decay groups against learning rates
and updates derived by hand (the formulas below are torch's: LambdaLR over
transformers' linear/cosine schedules with warm-up, torch.optim.SGD's L2
term and AdamW's decoupled decay), and the same options through the Python
package.  Run by ctest with GRADC_BIN and GRADC_SOURCE_DIR set."""
import csv
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SRC = os.environ.get("GRADC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradc  # noqa: E402

GRADC = os.environ.get("GRADC_BIN", os.path.join(SRC, "build", "gradc"))

MODEL = """model lin {
  batch B = 4
  dim   D = 3
  input  x : f32[B, D]
  input  y : f32[B, 2]
  param  W    : f32[D, 2] init normal(0, 0.5)
  param  b    : f32[2]    init normal(0, 0.5)
  param  ln_w : f32[2]    init ones
  loss mse = mse_loss((x @ W + b) * ln_w, y)
}
"""

LR, WARMUP, STEPS, MIN_LR = 0.1, 3, 10, 0.01


def lr_by_hand(schedule, s):
    """The rate of step s (0-based), by the formulas of the help text."""
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    if schedule == "constant":
        return LR
    p = min((s - WARMUP) / (STEPS - WARMUP), 1.0)
    shape = 1 - p if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * p))
    return MIN_LR + (LR - MIN_LR) * shape


class TrainOptions(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        t = self._tmp.name
        self.model = os.path.join(t, "lin.gdl")
        with open(self.model, "w") as f:
            f.write(MODEL)
        rng = np.random.default_rng(0)
        # One window exactly: every step sees the whole dataset.
        self.data = os.path.join(t, "data.safetensors")
        gradc.write_safetensors(self.data, {"x": rng.normal(size=(4, 3)).astype(np.float32),
                                            "y": rng.normal(size=(4, 2)).astype(np.float32)})
        self.p0 = os.path.join(t, "p0.safetensors")
        self.cli("init", self.model, "-o", self.p0, "--seed", 1)
        self.grads = os.path.join(t, "g.safetensors")
        self.cli("run", self.model, "--params", self.p0, "--inputs", self.data, "--grads-out", self.grads)
        self.t = t

    def tearDown(self):
        self._tmp.cleanup()

    def cli(self, *args, ok=True):
        p = subprocess.run([GRADC] + [str(a) for a in args], capture_output=True, text=True)
        if ok and p.returncode != 0:
            self.fail("gradc %s: exit %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr))
        return p

    def train(self, *flags):
        log = os.path.join(self.t, "log.csv")
        out = os.path.join(self.t, "p1.safetensors")
        p = self.cli("train", self.model, "--data", self.data, "--init", self.p0, "--log", log,
                     "--params-out", out, *flags)
        with open(log) as f:
            rows = list(csv.DictReader(f))
        return [float(r["lr"]) for r in rows], gradc.read_safetensors(out), p.stderr

    def test_schedules(self):
        for sched in ("constant", "linear", "cosine"):
            flags = ["--schedule", sched, "--lr", LR, "--warmup", WARMUP, "--steps", STEPS]
            if sched != "constant":
                flags += ["--min-lr", MIN_LR]
            lrs, _, err = self.train(*flags)
            want = [lr_by_hand(sched, s) for s in range(STEPS)]
            self.assertEqual(len(lrs), STEPS)
            for s, (got, exp) in enumerate(zip(lrs, want)):
                self.assertAlmostEqual(got, exp, delta=1e-12 * LR, msg="%s, step %d" % (sched, s))
            if sched != "constant":
                self.assertIn(", %s to 0.01 at step 10" % sched, err)
        # --cosine is --schedule cosine
        self.assertEqual(self.train("--cosine", "--lr", LR, "--warmup", WARMUP, "--steps", STEPS, "--min-lr", MIN_LR)[0],
                         self.train("--schedule", "cosine", "--lr", LR, "--warmup", WARMUP, "--steps", STEPS,
                                    "--min-lr", MIN_LR)[0])
        # the hand formula reaches min_lr at the last step for linear: a check of the check
        self.assertAlmostEqual(lr_by_hand("linear", STEPS), MIN_LR)

    def test_schedule_errors(self):
        p = self.cli("train", self.model, "--data", self.data, "--schedule", "step", ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("gradc: error: --schedule expects constant, linear or cosine, got 'step'", p.stderr)
        p = self.cli("train", self.model, "--data", self.data, "--min-lr", "0.1", ok=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--min-lr applies to --schedule linear or cosine", p.stderr)
        p = self.cli("train", self.model, "--data", self.data, "--cosine", "--schedule", "linear", ok=False)
        self.assertIn("--cosine and --schedule linear disagree", p.stderr)

    def sgd_step(self, *flags):
        _, p1, _ = self.train("--optimizer", "sgd", "--lr", 0.1, "--weight-decay", 0.5, "--steps", 1, *flags)
        return p1

    def expect(self, p1, decayed, sgd=True):
        p0, g = gradc.read_safetensors(self.p0), gradc.read_safetensors(self.grads)
        for k in ("W", "b", "ln_w"):
            a, d = p0[k].astype(np.float64), g[k].astype(np.float64)
            if sgd:  # torch.optim.SGD: d_p = g + wd * p; p -= lr * d_p
                want = a - 0.1 * (d + (0.5 * a if k in decayed else 0))
            else:  # AdamW's first step: p *= 1 - lr*wd; p -= lr * g / (|g| + eps)
                want = a * (1 - 0.1 * 0.5 if k in decayed else 1) - 0.1 * d / (np.abs(d) + 1e-8)
            np.testing.assert_allclose(p1[k], want, rtol=2e-6, atol=1e-7, err_msg="%s (decayed: %s)" % (k, decayed))

    def test_weight_decay_groups(self):
        self.expect(self.sgd_step(), {"W"})  # default: 1-D params (b, ln_w) are not decayed
        self.expect(self.sgd_step("--decay-1d"), {"W", "b", "ln_w"})
        self.expect(self.sgd_step("--no-decay", "W"), set())
        self.expect(self.sgd_step("--decay-1d", "--no-decay", "ln_*"), {"W", "b"})
        self.expect(self.sgd_step("--decay-1d", "--no-decay", "ln_*,W"), {"b"})
        self.expect(self.sgd_step("--decay-1d", "--no-decay", "ln_*", "--no-decay", "b"), {"W"})  # repeated flags add up
        _, p1, _ = self.train("--lr", 0.1, "--weight-decay", 0.5, "--steps", 1)
        self.expect(p1, {"W"}, sgd=False)

    def test_python_options(self):
        prog = gradc.compile(self.model)
        inputs = {k: v for k, v in gradc.read_safetensors(self.data).items()}
        for sched in ("constant", "linear", "cosine"):
            s = prog.session(self.p0)
            for st in range(STEPS):
                s.run(inputs)
                s.step(optimizer="sgd", lr=LR, warmup_steps=WARMUP, total_steps=STEPS, min_lr=MIN_LR, schedule=sched)
                # sess.lr is the rate the next step uses: step st + 1's
                self.assertAlmostEqual(s.lr, lr_by_hand(sched, st + 1), delta=1e-12, msg="%s, step %d" % (sched, st + 1))
        with self.assertRaisesRegex(gradc.Error, "unknown schedule 'step'"):
            s.step(optimizer="sgd", schedule="step")
        s = prog.session(self.p0)
        s.run(inputs)
        s.step(optimizer="sgd", lr=0.1, weight_decay=0.5, no_decay_1d=True, no_decay=["ln_*"])
        self.expect({k: v.copy() for k, v in s.params.items()}, {"W"})
        s = prog.session(self.p0)
        s.run(inputs)
        s.step(optimizer="sgd", lr=0.1, weight_decay=0.5)  # torch's default: every param decays
        self.expect({k: v.copy() for k, v in s.params.items()}, {"W", "b", "ln_w"})

    def test_help_says_the_defaults(self):
        out = self.cli("help", "train").stdout + self.cli("help", "train").stderr
        for words in ("--schedule constant (the default)", "skips", "rank <= 1", "--no-decay", "--decay-1d"):
            self.assertIn(words, " ".join(out.split()))


if __name__ == "__main__":
    unittest.main(verbosity=2)

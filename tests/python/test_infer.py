"""Forward-only use of the Python package: prog.infer runs the model
compiled forward-only (no gradient buffers, grads None) and gives `gradc
infer`'s and `run`'s losses; r.outputs carries the model's `output`s,
equal to `run --outputs-out` and to NumPy's own product; `gradc generate
--temperature 0` follows the argmax of logits computed here.  Run by ctest
with GRADC_BIN, GRADC_LIB and GRADC_SOURCE_DIR set."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SRC = os.environ.get("GRADC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradc  # noqa: E402

GRADC = os.environ.get("GRADC_BIN", os.path.join(SRC, "build", "gradc"))
TINYGPT = os.path.join(SRC, "examples", "tinygpt.gdl")
SMALL = {"C": 32, "L": 1, "NH": 2, "T": 16, "B": 4}


def cli(*args):
    p = subprocess.run([GRADC] + [str(a) for a in args], capture_output=True)
    if p.returncode != 0:
        raise AssertionError("gradc %s: exit %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr.decode()))
    return p.stdout.decode("latin-1")


def flags(defines):
    out = []
    for k, v in defines.items():
        out += ["-D", "%s=%d" % (k, v)]
    return out


def losses_of(text):
    return {k: float(v) for k, v in re.findall(r"^loss (\S+) (\S+)$", text, re.M)}


class Tmp(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)


class TestInfer(Tmp):
    def setUp(self):
        super().setUp()
        self.params, self.batch = self.path("p.safetensors"), self.path("b.safetensors")
        cli("init", TINYGPT, *flags(SMALL), "-o", self.params, "--seed", 2)
        cli("data", "random", TINYGPT, *flags(SMALL), "-o", self.batch, "--seed", 3)
        self.inputs = gradc.read_safetensors(self.batch)

    def test_infer_runs_the_forward_only_program(self):
        prog = gradc.compile(TINYGPT, defines=SMALL)
        self.assertFalse(prog.forward_only)
        r = prog.infer(self.params, self.inputs)
        self.assertIsNone(r.grads)
        self.assertTrue(prog._forward.forward_only)
        # No gradient buffers: well under half the training step's arena.
        self.assertLess(2 * prog._forward.arena_bytes, prog.arena_bytes)
        # The same values as the training step's forward, and as `gradc infer`.
        t = prog.session(self.params).run(self.inputs)
        for k in t.losses:
            self.assertAlmostEqual(r.losses[k], t.losses[k], delta=1e-6 * abs(t.losses[k]))
        np.testing.assert_allclose(r.outputs["logits"], t.outputs["logits"], rtol=0, atol=1e-5)
        want = losses_of(cli("infer", TINYGPT, *flags(SMALL), "--params", self.params, "--inputs", self.batch))
        self.assertEqual({k: "%.9g" % v for k, v in r.losses.items()}, {k: "%.9g" % v for k, v in want.items()})

    def test_run_outputs_equal_outputs_out(self):
        out = self.path("o.safetensors")
        cli("run", TINYGPT, *flags(SMALL), "--params", self.params, "--inputs", self.batch, "--outputs-out", out)
        ref = gradc.read_safetensors(out)["logits"]
        r = gradc.compile(TINYGPT, defines=SMALL).session(self.params).run(self.inputs)
        self.assertEqual(sorted(r.outputs), ["logits"])
        self.assertEqual(r.outputs["logits"].shape, (4, 16, 96))
        self.assertTrue(np.array_equal(r.outputs["logits"].view(np.uint32), ref.view(np.uint32)))

    def test_forward_only_session_has_no_gradients(self):
        prog = gradc.compile(TINYGPT, defines=SMALL, forward_only=True)
        s = prog.session(self.params)
        r = s.run(self.inputs)
        self.assertIsNone(r.grads)
        with self.assertRaises(gradc.Error) as e:
            s.step(optimizer="sgd", lr=0.1)
        self.assertIn("forward-only", str(e.exception))
        self.assertIs(prog.infer(self.params, self.inputs).grads, None)

    def test_training_artifact_is_refused(self):
        art = self.path("t.gca")
        cli("compile", TINYGPT, *flags(SMALL), "-o", art)
        with self.assertRaises(gradc.Error) as e:
            gradc.load(art).infer(self.params, self.inputs)
        self.assertIn("forward-only", str(e.exception))
        fwd = self.path("f.gca")
        cli("compile", TINYGPT, *flags(SMALL), "--forward-only", "-o", fwd)
        r = gradc.load(fwd).infer(self.params, self.inputs)
        self.assertEqual(r.outputs["logits"].shape, (4, 16, 96))


class TestOutputs(unittest.TestCase):
    def test_outputs_are_numpys_product(self):
        src = """model lin {
  batch B = 5
  dim D = 3
  input x : f32[B, D]
  param W : f32[D, 2] init normal(0, 1)
  param b : f32[2] init normal(0, 1)
  output y = x @ W + b
  output s = sum(y, axis=1)
  loss l = mean(y * y)
}
"""
        prog = gradc.compile(src)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((5, 3)).astype(np.float32)
        sess = prog.session(seed=4)
        W, b = sess.params["W"].copy(), sess.params["b"].copy()
        for r in (sess.run({"x": x}), prog.infer({"W": W, "b": b}, {"x": x})):
            y = x.astype(np.float64) @ W + b
            np.testing.assert_allclose(r.outputs["y"], y, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(r.outputs["s"], y.sum(axis=1), rtol=1e-5, atol=1e-6)
            self.assertAlmostEqual(r.losses["l"], float(np.mean(y * y)), delta=1e-5)


class TestGenerate(Tmp):
    def test_temperature_zero_follows_the_argmax(self):
        defs = dict(SMALL, V=256)
        params = self.path("p.safetensors")
        cli("init", TINYGPT, *flags(defs), "-o", params, "--seed", 7)
        prompt, n = "hello", 6
        text = cli("generate", TINYGPT, *flags(defs), "--params", params, "--prompt", prompt,
                   "--max-tokens", n, "--temperature", 0)
        self.assertEqual(len(text), len(prompt) + n + 1)
        # The same choices made here from the forward-only logits of B = 1.
        prog = gradc.compile(TINYGPT, defines=dict(defs, B=1), forward_only=True)
        ctx = [ord(c) for c in prompt]
        for _ in range(n):
            idx = np.zeros((1, 16), np.int32)
            idx[0, :len(ctx)] = ctx
            r = prog.infer(params, {"idx": idx, "targets": np.zeros((1, 16), np.int32)})
            ctx.append(int(np.argmax(r.outputs["logits"][0, len(ctx) - 1])))
        self.assertEqual(text[:-1], "".join(map(chr, ctx)))
        # --top-k 1 leaves only the argmax to draw, whatever the seed and temperature.
        for seed in (1, 2):
            k1 = cli("generate", TINYGPT, *flags(defs), "--params", params, "--prompt", prompt,
                     "--max-tokens", n, "--top-k", 1, "--temperature", 2, "--seed", seed)
            self.assertEqual(k1, text)
        # Seeded sampling repeats itself.
        a = cli("generate", TINYGPT, *flags(defs), "--params", params, "--prompt", prompt, "--seed", 11, "--top-k", 5)
        b = cli("generate", TINYGPT, *flags(defs), "--params", params, "--prompt", prompt, "--seed", 11, "--top-k", 5)
        self.assertEqual(a, b)

    def test_python_generate(self):
        defs = dict(SMALL, V=256)
        params = self.path("p.safetensors")
        cli("init", TINYGPT, *flags(defs), "-o", params, "--seed", 7)
        prompt, n = "hello", 6
        greedy = cli("generate", TINYGPT, *flags(defs), "--params", params, "--prompt", prompt,
                     "--max-tokens", n, "--temperature", 0)
        prog = gradc.compile(TINYGPT, defines=defs)  # a training program: generate uses its forward-only twin
        # Temperature 0 makes the command line's choices (every row of B holds the context).
        self.assertEqual(prog.generate(params, prompt, max_tokens=n, temperature=0).decode(), greedy[:-1])
        # A seed repeats itself; top_k=1 is the argmax whatever the seed.
        a = prog.generate(params, prompt, max_tokens=n, seed=3, top_k=5)
        self.assertEqual(a, prog.generate(params, prompt, max_tokens=n, seed=3, top_k=5))
        self.assertEqual(len(a), len(prompt) + n)
        self.assertEqual(prog.generate(params, prompt, max_tokens=n, temperature=2, top_k=1, seed=9).decode(),
                         greedy[:-1])
        # A vocabulary that cannot spell the prompt, and a model without logits.
        with self.assertRaises(gradc.Error) as e:
            prog.generate(params, "hi", vocab=[ord("h")])
        self.assertIn("not in the vocabulary", str(e.exception))
        mlp = gradc.compile(os.path.join(SRC, "examples", "mlp.gdl"), defines={"B": 4, "D": 3, "H": 5})
        with self.assertRaises(gradc.Error) as e:
            mlp.generate(None, "hi")
        self.assertIn("output logits", str(e.exception))


if __name__ == "__main__":
    unittest.main()

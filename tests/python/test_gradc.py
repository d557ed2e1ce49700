"""The Python package (python/gradc) against the command line and the C API
underneath it: losses and gradients equal `gradc run`'s bit for bit on mlp
and tinygpt, params are views of the session's storage, errors carry the
diagnostic, artifacts and checkpoints round-trip, and arrays arrive through
__array__ and DLPack.  Run by ctest (tests/CMakeLists.txt) with GRADC_BIN,
GRADC_LIB and GRADC_SOURCE_DIR set; plain unittest, so pytest collects it
too."""
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np  # no NumPy is a failure here, not a skip

SRC = os.environ.get("GRADC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradc  # noqa: E402

GRADC = os.environ.get("GRADC_BIN", os.path.join(SRC, "build", "gradc"))
MLP = os.path.join(SRC, "examples", "mlp.gdl")
TINYGPT = os.path.join(SRC, "examples", "tinygpt.gdl")


def cli(*args):
    p = subprocess.run([GRADC] + [str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError("gradc %s: exit %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p.stdout


def defs_flags(defines):
    out = []
    for k, v in defines.items():
        out += ["-D", "%s=%d" % (k, v)]
    return out


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


class Tmp(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)


class TestAgainstRun(Tmp):
    """Python's losses and gradients are `gradc run`'s, bit for bit."""

    def check_model(self, model, defines, gas, precision=None):
        params, batch, grads = self.path("p.safetensors"), self.path("b.safetensors"), self.path("g.safetensors")
        flags = defs_flags(defines) + ["--gas", gas] + (["--precision", precision] if precision else [])
        cli("init", model, *defs_flags(defines), "-o", params, "--seed", 3)
        cli("data", "random", model, *defs_flags(defines), "-o", batch, "--seed", 4)
        out = cli("run", model, *flags, "--params", params, "--inputs", batch, "--grads-out", grads)
        want = dict(re.findall(r"^loss (\S+) (\S+)$", out, re.M))
        self.assertIn("total", want)

        prog = gradc.compile(model, defines=defines, gas=gas, precision=precision)
        inputs = gradc.read_safetensors(batch)
        for how, sess in (("a params file", prog.session(params)),
                          ("a dict", prog.session(gradc.read_safetensors(params))),
                          ("the declared init, seed 3", prog.session(seed=3))):
            r = sess.run(inputs)
            got = {k: "%.9g" % v for k, v in r.losses.items()}
            self.assertEqual(got, want, "losses, params from %s" % how)
            ref = gradc.read_safetensors(grads)
            self.assertEqual(sorted(r.grads), sorted(ref))
            for k in ref:
                self.assertEqual(r.grads[k].dtype, ref[k].dtype, k)
                self.assertTrue(np.array_equal(bits(r.grads[k]), bits(ref[k])), "gradient %s (%s)" % (k, how))
        return r

    def test_mlp(self):
        r = self.check_model(MLP, {"B": 16, "H": 32}, 2)
        self.assertEqual(sorted(r.losses), ["ce", "l2", "total"])

    def test_tinygpt(self):
        self.check_model(TINYGPT, {"B": 4, "T": 16, "C": 32, "L": 2}, 1)

    def test_mixed_precision(self):
        # bf16 and f16 (mixed precision) as the command line runs them.
        self.check_model(MLP, {"B": 16, "H": 32}, 2, "bf16")
        self.check_model(TINYGPT, {"B": 4, "T": 16, "C": 32, "L": 2}, 1, "f16")

    def test_infer_is_run_without_grads(self):
        prog = gradc.compile(MLP, defines={"B": 8})
        batch = self.path("b.safetensors")
        cli("data", "random", MLP, "-D", "B=8", "-o", batch)
        inputs = gradc.read_safetensors(batch)
        params = prog.session(seed=1).params
        r = prog.infer(params, inputs)
        self.assertIsNone(r.grads)
        self.assertEqual(r.losses, prog.session(seed=1).run(inputs).losses)


class TestParams(unittest.TestCase):
    def setUp(self):
        self.prog = gradc.compile(MLP, defines={"B": 8, "D": 12, "H": 6})
        rng = np.random.default_rng(0)
        self.inputs = {"x": rng.normal(size=(8, 12)).astype(np.float32), "y": rng.integers(0, 10, 8).astype(np.int32)}

    def test_params_are_views_not_copies(self):
        sess = self.prog.session(seed=0)
        a, b = sess.params["W1"], sess.params["W1"]
        self.assertEqual(a.ctypes.data, b.ctypes.data)  # the same storage each time
        self.assertTrue(np.shares_memory(a, b))
        before = a.copy()
        sess.run(self.inputs)
        sess.step(optimizer="sgd", lr=0.5)
        self.assertFalse(np.array_equal(a, before), "the view did not see the step")
        # The C API's own copy agrees with the view.
        out = np.empty_like(a)
        gradc._check(gradc._lib.session_get_param(sess._h, b"W1", out.ctypes.data_as(gradc.ctypes.c_void_p), out.size))
        self.assertTrue(np.array_equal(out, a))
        # So does a view taken after init_params re-initialises in place.
        gradc._check(gradc._lib.session_init_params(sess._h, 0))
        self.assertTrue(np.array_equal(a, before))

    def test_writing_into_a_view_changes_the_run(self):
        sess = self.prog.session(seed=0)
        sess.run(self.inputs)
        sess.params["W2"][:] = 0  # logits 0: ce = log(10) whatever x
        r = sess.run(self.inputs)
        self.assertAlmostEqual(r.losses["ce"], math.log(10), places=6)

    def test_view_outlives_the_session_object(self):
        w = self.prog.session(seed=0).params["b1"]
        self.assertEqual(w.shape, (6,))
        self.assertTrue(np.all(w == 0))  # b1 is declared zeros; the session lives on in the view

    def test_torch_like_inputs(self):
        class ArrayLike:  # a CPU torch tensor as NumPy sees it: __array__
            def __init__(self, a):
                self.a = a

            def __array__(self, dtype=None, copy=None):
                return self.a if dtype is None else self.a.astype(dtype)

        class DLPackOnly:  # only the DLPack protocol
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, stream=None):
                return self.a.__dlpack__()

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        want = self.prog.session(seed=0).run(self.inputs).losses
        for wrap in (ArrayLike, DLPackOnly):
            got = self.prog.session(seed=0).run({k: wrap(v) for k, v in self.inputs.items()}).losses
            self.assertEqual(got, want, wrap.__name__)
        # int64 targets and float64 features arrive too (the C API converts)
        got = self.prog.session(seed=0).run({"x": self.inputs["x"].astype(np.float64),
                                             "y": self.inputs["y"].astype(np.int64)}).losses
        self.assertEqual(got, want)


class TestErrors(Tmp):
    def test_diagnostic_from_source(self):
        src = "model m {\n  batch B = 4\n  input x : f32[B, 3]\n  loss l = sum(x @ w)\n}\n"
        with self.assertRaises(gradc.Error) as cm:
            gradc.compile(src, name="bad.gdl")
        msg = str(cm.exception)
        self.assertRegex(msg, r"^bad\.gdl:4:\d+: error: ")
        self.assertIn("^", msg)  # the caret line
        self.assertEqual(cm.exception.status, 1)

    def test_diagnostic_from_file(self):
        path = self.path("shape.gdl")
        with open(path, "w") as f:
            f.write("model m {\n  batch B = 4\n  input x : f32[B, 3]\n  param w : f32[4, 2]\n  loss l = sum(x @ w)\n}\n")
        with self.assertRaises(gradc.Error) as cm:
            gradc.compile(path)
        self.assertRegex(str(cm.exception), "^" + re.escape(path) + r":5:\d+: error: .*f32\[4,3\] @ f32\[4,2\]")

    def test_user_errors(self):
        with self.assertRaisesRegex(gradc.Error, r"^gradc: error: .*no-such\.gdl"):
            gradc.compile(self.path("no-such.gdl"))
        prog = gradc.compile(MLP, defines={"B": 4})
        sess = prog.session()
        with self.assertRaisesRegex(gradc.Error, "'z' is not an input"):
            sess.run({"z": np.zeros(3, np.float32)})
        with self.assertRaisesRegex(gradc.Error, "input 'x' .* has 3136 elements, got 3"):
            sess.run({"x": np.zeros(3, np.float32)})
        with self.assertRaisesRegex(gradc.Error, "missing param 'b1'"):
            prog.session({"W1": np.zeros((784, 256)), "W2": np.zeros((256, 10))})
        with self.assertRaisesRegex(gradc.Error, "unknown optimizer"):
            sess.step(optimizer="lion")
        with self.assertRaisesRegex(gradc.Error, "lr must be >= 0"):
            sess.step(lr=-1)


class TestFiles(Tmp):
    def setUp(self):
        super().setUp()
        self.defines = {"B": 8, "D": 12, "H": 6}
        rng = np.random.default_rng(1)
        self.windows = [{"x": rng.normal(size=(8, 12)).astype(np.float32),
                         "y": rng.integers(0, 10, 8).astype(np.int32)} for _ in range(5)]

    def test_artifact_round_trip(self):
        prog = gradc.compile(MLP, defines=self.defines, gas=2)
        art = self.path("mlp.gca")
        prog.save(art)
        for loaded in (gradc.load(art), gradc.compile(art)):
            self.assertEqual(loaded.gas, 2)
            self.assertEqual([p.name for p in loaded.params], ["W1", "b1", "W2"])
            want = prog.session(seed=2).run(self.windows[0])
            got = loaded.session(seed=2).run(self.windows[0])
            self.assertEqual(got.losses, want.losses)
            self.assertTrue(np.array_equal(got.grads["W1"], want.grads["W1"]))

    def test_checkpoint_resumes_bit_identically(self):
        prog = gradc.compile(MLP, defines=self.defines)
        ckpt = self.path("ckpt.safetensors")

        def steps(sess, windows):
            out = []
            for w in windows:
                out.append(sess.run(w).losses["total"])
                sess.step(optimizer="adamw", lr=1e-2)
            return out

        a = prog.session(seed=0)
        steps(a, self.windows[:3])
        a.save_checkpoint(ckpt)
        want = steps(a, self.windows[3:])
        b = prog.session(seed=7)
        b.load_checkpoint(ckpt)
        self.assertEqual(b.step_count, 3)
        self.assertEqual(steps(b, self.windows[3:]), want)
        # The checkpoint holds the optimiser state under optim.<slot>.<param>.
        names = gradc.read_safetensors(ckpt)
        self.assertIn("optim.exp_avg.W1", names)
        self.assertIn("optim.exp_avg_sq.b1", names)

    def test_params_and_grads_files(self):
        prog = gradc.compile(MLP, defines=self.defines)
        s = prog.session(seed=5)
        r = s.run(self.windows[0])
        s.save_params(self.path("p.safetensors"))
        s.save_grads(self.path("g.safetensors"))
        p, g = gradc.read_safetensors(self.path("p.safetensors")), gradc.read_safetensors(self.path("g.safetensors"))
        for k, v in s.params.items():
            self.assertTrue(np.array_equal(p[k], v))
            self.assertTrue(np.array_equal(g[k], r.grads[k]))
        gradc.write_safetensors(self.path("q.safetensors"), p)
        t = prog.session(self.path("q.safetensors"))
        self.assertEqual(t.run(self.windows[0]).losses, r.losses)


class TestTrainingLoop(Tmp):
    """A training loop in Python gives `gradc train`'s losses bit for bit:
    the same init (--seed), the same data order (train's per-epoch
    Fisher-Yates shuffle, re-derived here from the session generator the C
    API exposes), the same AdamW with train's defaults (1-D params not
    decayed)."""

    def order(self, sess, n, scratch):
        key = sess.rng_next()  # one draw of the session generator per epoch
        scratch.rng_seed(key)
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            j = (scratch.rng_next() * (i + 1)) >> 64
            perm[i], perm[j] = perm[j], perm[i]
        return perm

    def test_losses_equal_gradc_train(self):
        defines, seed, steps, n, b = {"B": 4, "D": 6, "H": 5}, 3, 7, 12, 4
        rng = np.random.default_rng(2)
        data = {"x": rng.normal(size=(n, 6)).astype(np.float32), "y": rng.integers(0, 10, n).astype(np.int32)}
        path, log = self.path("data.safetensors"), self.path("log.csv")
        gradc.write_safetensors(path, data)
        cli("train", MLP, *defs_flags(defines), "--data", path, "--steps", steps, "--seed", seed,
            "--lr", "0.01", "--warmup", 2, "--schedule", "cosine", "--log", log)
        with open(log) as f:
            rows = [line.strip().split(",") for line in f][1:]
        want = [float(r[4]) for r in rows]  # step, lr, ce, l2, total, ...

        prog = gradc.compile(MLP, defines=defines)
        sess, scratch = prog.session(seed=seed), prog.session()
        sess.rng_seed(seed ^ 0x5851F42D4C957F2D)  # train seeds the data order apart from the init
        got, perm = [], None
        for step in range(steps):
            w = step % (n // b)
            if w == 0:
                perm = self.order(sess, n, scratch)
            idx = perm[w * b:(w + 1) * b]
            r = sess.run({k: v[idx] for k, v in data.items()})
            sess.step(optimizer="adamw", lr=0.01, warmup_steps=2, total_steps=steps, schedule="cosine",
                      no_decay_1d=True)
            got.append(r.losses["total"])
        self.assertEqual(len(want), steps)
        self.assertEqual(got, want)


class TestReadme(unittest.TestCase):
    def test_readme_example_runs(self):
        with open(os.path.join(SRC, "python", "README.md")) as f:
            text = f.read()
        blocks = re.findall(r"```python\n(.*?)```", text, re.S)
        self.assertEqual(len(blocks), 1)
        self.assertLessEqual(len(blocks[0].strip().splitlines()), 20)
        cwd = os.getcwd()
        os.chdir(SRC)
        try:
            exec(compile(blocks[0], "python/README.md", "exec"), {"__name__": "readme"})
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""`gradc convert` on small hand-made safetensors files (written byte by byte
here, not by the package): renaming, `{l}` stacking, `transpose`, F16/BF16
widening, --model's checks and their messages; `train --init-partial`; and
`run --params` on a checkpoint.  Expected tensors are built with NumPy from
the same source arrays.  Run by ctest with GRADC_BIN and GRADC_SOURCE_DIR."""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SRC = os.environ.get("GRADC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "python"))
import gradc  # noqa: E402  (read_safetensors only)

GRADC = os.environ.get("GRADC_BIN", os.path.join(SRC, "build", "gradc"))

MODEL = """model stack {
  batch B = 4
  dim   C = 3
  dim   O = 2
  dim   L = %d
  input  x : f32[B, C]
  input  y : f32[B, O]
  param  w    : f32[L, C, C] init normal(0, 0.3)
  param  bias : f32[L, C]
  param  head : f32[C, O]    init normal(0, 0.3)
  h = x
  for l in 0..L {
    h = tanh(h @ w[l] + bias[l])
  }
  loss mse = mse_loss(h @ head, y)
}
"""

MAP = """# torch.nn.Linear keeps weight as [out, in]; gradc's x @ w wants [in, out]
w    <- blocks.{l}.weight transpose
bias <- blocks.{l}.bias
head <- lm_head.weight transpose   # stored BF16
"""


def write_st(path, entries, metadata=None):
    """entries: (name, dtype string, shape, raw little-endian bytes)."""
    head, off, blobs = {}, 0, []
    if metadata:
        head["__metadata__"] = metadata
    for name, dt, shape, raw in entries:
        head[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(head).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_bytes(a):
    """a (f32) rounded to bf16 by truncation: values chosen exact in bf16."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    assert np.all(u & 0xFFFF == 0), "test values must be exact in bf16"
    return (u >> 16).astype("<u2").tobytes()


class Convert(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.t = self._tmp.name
        rng = np.random.default_rng(0)
        self.blk_w = [rng.normal(size=(3, 3)).astype(np.float32) for _ in range(2)]  # [out, in]
        self.blk_b = [rng.normal(size=3).astype(np.float64) for _ in range(2)]       # F64 source
        self.lm = (np.round(rng.normal(size=(2, 3)) * 8) / 8).astype(np.float32)      # [O, C], exact in bf16
        entries = []
        for l in range(2):
            entries.append(("blocks.%d.weight" % l, "F32", (3, 3), self.blk_w[l].astype("<f4").tobytes()))
            entries.append(("blocks.%d.bias" % l, "F64", (3,), self.blk_b[l].astype("<f8").tobytes()))
        entries.append(("lm_head.weight", "BF16", (2, 3), bf16_bytes(self.lm)))
        entries.append(("blocks.0.attn.masked_bias", "F16", (2,), np.array([1, -2], "<f2").tobytes()))  # not mapped
        self.src = self.file("hf.safetensors")
        write_st(self.src, entries, {"format": "pt"})
        self.map = self.write("model.map", MAP)
        self.model = self.write("stack.gdl", MODEL % 2)

    def tearDown(self):
        self._tmp.cleanup()

    def file(self, name):
        return os.path.join(self.t, name)

    def write(self, name, text):
        with open(self.file(name), "w") as f:
            f.write(text)
        return self.file(name)

    def cli(self, *args, ok=True):
        p = subprocess.run([GRADC] + [str(a) for a in args], capture_output=True, text=True)
        if ok and p.returncode != 0:
            self.fail("gradc %s: exit %d\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr))
        if not ok:
            self.assertEqual(p.returncode, 1, p.stderr)
        return p

    def expected(self):
        return {"w": np.stack([w.T for w in self.blk_w]).astype(np.float32),
                "bias": np.stack(self.blk_b).astype(np.float32),
                "head": self.lm.T.copy()}

    def test_convert_stacks_transposes_and_widens(self):
        for with_model in (False, True):
            out = self.file("p.safetensors")
            extra = ["--model", self.model] if with_model else []
            self.cli("convert", self.src, "--map", self.map, "-o", out, *extra)
            got = gradc.read_safetensors(out)
            got.pop("__metadata__", None)
            want = self.expected()
            if not with_model:  # an F64 source stays F64 unless the model says f32
                want["bias"] = np.stack(self.blk_b)
            self.assertEqual(sorted(got), sorted(want))
            for k in want:
                self.assertEqual(got[k].dtype, want[k].dtype, k)
                self.assertEqual(got[k].shape, want[k].shape, k)
                self.assertTrue(np.array_equal(got[k], want[k]), k)
        # The result is a params file: gradc run takes it.
        batch = self.file("b.safetensors")
        self.cli("data", "random", self.model, "-o", batch)
        self.assertRegex(self.cli("run", self.model, "--params", out, "--inputs", batch).stdout, r"loss total \S+")

    def test_model_checks(self):
        out = self.file("p.safetensors")
        # a param nothing covers
        m = self.write("partial.map", "w <- blocks.{l}.weight transpose\nbias <- blocks.{l}.bias\n")
        p = self.cli("convert", self.src, "--map", m, "-o", out, "--model", self.model, ok=False)
        self.assertIn("gradc: error: %s: 'head' of %s has no line" % (m, self.model), p.stderr)
        # without --model the same map converts (a partial params file)
        self.cli("convert", self.src, "--map", m, "-o", out)
        # a shape that needs transpose
        m = self.write("notr.map", MAP.replace("head <- lm_head.weight transpose", "head <- lm_head.weight"))
        p = self.cli("convert", self.src, "--map", m, "-o", out, "--model", self.model, ok=False)
        self.assertIn("%s:4: 'head' <- 'lm_head.weight': the model declares f32[3,2], the map gives f32[2,3] (transpose?)" % m,
                      p.stderr)
        # a layer the file lacks: the model has 3
        p = self.cli("convert", self.src, "--map", self.map, "-o", out,
                     "--model", self.write("stack3.gdl", MODEL % 3), ok=False)
        self.assertIn("%s: tensor 'blocks.2.weight' (%s:2): not in the file" % (self.src, self.map), p.stderr)
        # a DEST that is not a param, a source that is not there, a bad line, a twice-mapped DEST
        for text, msg in (("wte <- lm_head.weight\n", ":1: 'wte' is not a param of"),
                          ("head <- lm_head.weigth transpose\n", "tensor 'lm_head.weigth' (%s:1): not in the file"),
                          ("head = lm_head.weight\n", ":1: expected `DEST <- SOURCE [transpose]`"),
                          ("bias <- blocks.{l}.bias transpose\n", ":1: 'blocks.0.bias' has 1 axes; transpose needs at least 2"),
                          ("head <- lm_head.weight transpose\nhead <- lm_head.weight\n", ":2: 'head' is mapped twice (first at line 1)")):
            m = self.write("bad.map", text)
            p = self.cli("convert", self.src, "--map", m, "-o", out, "--model", self.model, ok=False)
            self.assertIn(msg.replace("%s", m), p.stderr)
            self.assertTrue(p.stderr.startswith("gradc: error: "), p.stderr)
        self.assertFalse(os.path.exists(self.file("never.safetensors")))
        p = self.cli("convert", self.src, "-o", out, ok=False)
        self.assertIn("convert needs --map MAP.txt", p.stderr)

    def test_train_init_partial_and_run_on_a_checkpoint(self):
        part = self.file("part.safetensors")
        m = self.write("partial.map", "w <- blocks.{l}.weight transpose\nbias <- blocks.{l}.bias\n")
        self.cli("convert", self.src, "--map", m, "-o", part)
        data = self.file("data.safetensors")
        rng = np.random.default_rng(1)
        gradc.write_safetensors(data, {"x": rng.normal(size=(8, 3)).astype(np.float32),
                                       "y": rng.normal(size=(8, 2)).astype(np.float32)})
        # Without --init-partial a subset is an error that says what to do.
        p = self.cli("train", self.model, "--data", data, "--init", part, "--steps", 1, ok=False)
        self.assertIn("gradc: error: %s: missing tensor 'head'\ngradc: note: --init-partial takes a file with some of the params"
                      % part, p.stderr)
        # With it: lr 0 leaves the params as they started, which --params-out shows.
        out, ckpt = self.file("out.safetensors"), self.file("ckpt.safetensors")
        p = self.cli("train", self.model, "--data", data, "--init", part, "--init-partial", "--seed", 5,
                     "--optimizer", "sgd", "--lr", 0, "--steps", 1, "--params-out", out, "--checkpoint", ckpt)
        self.assertIn("%s: 2 of 3 params; the others initialised as declared" % part, p.stderr)
        got, want = gradc.read_safetensors(out), self.expected()
        self.assertTrue(np.array_equal(got["w"], want["w"]))
        self.assertTrue(np.array_equal(got["bias"], want["bias"]))
        init = self.file("init.safetensors")
        self.cli("init", self.model, "-o", init, "--seed", 5)
        self.assertTrue(np.array_equal(got["head"], gradc.read_safetensors(init)["head"]))
        # The checkpoint (with optim.* tensors once SGD has momentum) serves as run --params.
        self.cli("train", self.model, "--data", data, "--init", out, "--optimizer", "sgd", "--momentum", 0.9,
                 "--lr", 0.1, "--steps", 2, "--params-out", out, "--checkpoint", ckpt)
        self.assertTrue(any(k.startswith("optim.") for k in gradc.read_safetensors(ckpt)))
        batch = self.file("b.safetensors")
        self.cli("data", "random", self.model, "-o", batch)
        a = self.cli("run", self.model, "--params", ckpt, "--inputs", batch).stdout
        b = self.cli("run", self.model, "--params", out, "--inputs", batch).stdout
        self.assertEqual(a, b)
        self.assertIn("loss total", a)
        # A tensor that is neither a param nor optimiser state is still refused.
        bad = self.file("bad.safetensors")
        t = gradc.read_safetensors(out)
        t.pop("__metadata__", None)
        t["wte.weight"] = np.zeros(2, np.float32)
        gradc.write_safetensors(bad, t)
        p = self.cli("run", self.model, "--params", bad, "--inputs", batch, ok=False)
        self.assertRegex(p.stderr, r"tensor 'wte\.weight': not a param")
        # init-partial refuses such a tensor too
        p = self.cli("train", self.model, "--data", data, "--init", bad, "--init-partial", "--steps", 1, ok=False)
        self.assertRegex(p.stderr, r"tensor 'wte\.weight': not a param")

    def test_python_partial_load(self):
        part = self.file("part.safetensors")
        self.cli("convert", self.src, "--map", self.write("p.map", "bias <- blocks.{l}.bias\n"), "-o", part)
        s = gradc.compile(self.model).session(seed=2)
        head = s.params["head"].copy()
        self.assertEqual(s.load_params(part, partial=True), 1)
        self.assertTrue(np.array_equal(s.params["bias"], self.expected()["bias"]))
        self.assertTrue(np.array_equal(s.params["head"], head))
        with self.assertRaisesRegex(gradc.Error, "missing tensor 'w'"):
            s.load_params(part)


if __name__ == "__main__":
    unittest.main(verbosity=2)

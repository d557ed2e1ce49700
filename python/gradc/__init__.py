"""gradc from Python: compile a model, open a session, run windows and
optimiser steps, with NumPy arrays in and out.

    import gradc
    prog = gradc.compile("examples/mlp.gdl", defines={"B": 64}, gas=1)
    sess = prog.session(seed=0)            # params as the model declares them
    r = sess.run({"x": x, "y": y})         # one window: forward and backward
    r.losses["total"], r.grads["W1"], r.outputs   # outputs: the model's `output`s
    sess.step(optimizer="adamw", lr=1e-3)
    prog.infer(sess.params, {"x": x, "y": y})     # forward only: losses and outputs

A thin layer over the C API of include/gradc.h (libgradc.so, through
ctypes; see _lib.py for how the library is found).  Anything with
__array__ or __dlpack__ (a PyTorch CPU tensor) is accepted where an array
is.  Failures raise gradc.Error with the library's diagnostic text.
"""
import ctypes
import json
import os
import struct

import numpy as np

from . import _lib

__all__ = ["Error", "Program", "Session", "Result", "compile", "load", "version",
           "read_safetensors", "write_safetensors"]


class Error(Exception):
    """A failure the library reported; str(e) is its diagnostic text
    ("mlp.gdl:3:7: error: ..." with the source line and caret, or
    "gradc: error: ...")."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.message = message
        self.status = status  # 1: a user error, 2: an internal one


def _check(st):
    if st != 0:
        raise Error(_lib.last_error().decode("utf-8", "replace"), st)


def version():
    return _lib.version().decode()


def _b(s):
    return os.fsencode(s) if isinstance(s, os.PathLike) else s.encode()


_NP = {_lib.F32: np.float32, _lib.F64: np.float64, _lib.I32: np.int32, _lib.I64: np.int64}
_DTYPE_NAMES = {_lib.F32: "f32", _lib.F64: "f64", _lib.BF16: "bf16", _lib.F16: "f16", _lib.I32: "i32", _lib.I64: "i64"}


def _as_array(x):
    """NumPy's view of x: an ndarray as it is, else through __array__
    (PyTorch, JAX, lists) or DLPack."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array__") or not hasattr(x, "__dlpack__"):
        return np.asarray(x)
    return np.from_dlpack(x)


class TensorInfo:
    """A param or input of a program's signature."""

    def __init__(self, ti):
        self.name = ti.name.decode()
        self.dtype = _DTYPE_NAMES.get(ti.dtype, "?")
        self.shape = tuple(ti.shape[i] for i in range(ti.rank))
        self.batched = bool(ti.batched)

    def __repr__(self):
        return "%s: %s%s" % (self.name, self.dtype, list(self.shape))


class Program:
    """A compiled model (gradc_program): its signature, sessions on it, and
    artifacts.  Made by gradc.compile or gradc.load."""

    def __init__(self, handle):
        self._h = handle
        n = _lib.program_num_params(handle)
        self.params = []
        for i in range(n):
            ti = _lib.TensorInfo()
            _check(_lib.program_param_info(handle, i, ctypes.byref(ti)))
            self.params.append(TensorInfo(ti))
        self.inputs = []
        for i in range(_lib.program_num_inputs(handle)):
            ti = _lib.TensorInfo()
            _check(_lib.program_input_info(handle, i, ctypes.byref(ti)))
            self.inputs.append(TensorInfo(ti))
        self.losses = [_lib.program_loss_name(handle, i).decode() for i in range(_lib.program_num_losses(handle))]
        self.outputs = [_lib.program_output_name(handle, i).decode() for i in range(_lib.program_num_outputs(handle))]
        self.gas = _lib.program_gas(handle)
        self.forward_only = bool(_lib.program_forward_only(handle))
        self.arena_bytes = _lib.program_arena_bytes(handle)  # the memory plan's bytes (0 on target "ref")
        self._recompile = None  # how to compile this model forward-only (infer), when known
        self._forward = None

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.program_free(h)

    def session(self, params=None, seed=0):
        """A session (gradc_session): params None (the model's declared
        init, seeded by seed), a safetensors path, or a dict name -> array
        holding every param."""
        s = Session(self)
        if params is None:
            _check(_lib.session_init_params(s._h, seed))
        else:
            s.load_params(params)
        return s

    def save(self, path):
        """Write an artifact (gradc compile -o): the planned IR and kernels."""
        _check(_lib.program_save(self._h, _b(path)))

    def _forward_program(self, what):
        """This program if it is forward-only, else its forward-only twin
        (compiled once, with the same sizes, K and target)."""
        if self.forward_only:
            return self
        if self._forward is None:
            if self._recompile is None:
                raise Error("gradc: error: %s: this program was loaded from an artifact compiled for "
                            "training; load one of `gradc compile --forward-only`, or compile the source" % what)
            self._forward = self._recompile()
        return self._forward

    def infer(self, params, inputs):
        """The forward values for one window, as `gradc infer`: a Result
        with losses and outputs (grads=None), computed by the model compiled
        forward-only (`training` false, no autodiff, no gradient buffers):
        this program if it is one, else its forward-only twin, compiled
        once with the same sizes, K and target.  params: as session()."""
        return self._forward_program("infer").session(params).run(inputs)

    def generate(self, params, prompt, max_tokens=64, temperature=1.0, top_k=0, seed=0, vocab=None, input=None):
        """Continue a text, as `gradc generate`: the model needs an i32[B, T]
        input (the tokens: the first such input, or `input`) and an `output
        logits` [B, T, V].  Each token is one forward (the forward-only
        program, as infer) over the last T tokens, zeros after them and in
        the other inputs; the next token is the argmax at temperature 0 (the
        same as the command line's), else a draw from softmax(logits /
        temperature) over the top_k largest (0: all) from NumPy's generator
        seeded by seed (deterministic for a seed, though not the command
        line's draws).  prompt: str or bytes; vocab: None (byte tokens) or
        the bytes of each token id (a `data text --compact` dataset's
        __metadata__ "vocab", read by read_safetensors).  Returns the prompt
        and the sampled text as bytes."""
        fwd = self._forward_program("generate")
        if temperature < 0:
            raise Error("gradc: error: generate: temperature must be >= 0, not %g" % temperature)
        if "logits" not in fwd.outputs:
            raise Error("gradc: error: generate needs an `output logits` of shape [B, T, V]; the model has %s"
                        % (", ".join(fwd.outputs) or "no outputs"))
        toks = [t for t in fwd.inputs if t.dtype == "i32" and len(t.shape) == 2 and (input is None or t.name == input)]
        if not toks:
            raise Error("gradc: error: generate needs an i32[B, T] input (the tokens)%s"
                        % ("" if input is None else "; '%s' is not one" % input))
        tok = toks[0]
        B, T = tok.shape
        text = prompt.encode() if isinstance(prompt, str) else bytes(prompt)
        if not text:
            raise Error("gradc: error: generate: the prompt is empty")
        if isinstance(vocab, str):
            vocab = json.loads(vocab)
        byte_of = list(range(256)) if vocab is None else [int(b) for b in vocab]
        id_of = {b: i for i, b in enumerate(byte_of)}
        for i, c in enumerate(text):
            if c not in id_of:
                raise Error("gradc: error: generate: prompt byte %d at offset %d is not in the vocabulary" % (c, i))
        ids = [id_of[c] for c in text]
        sess = fwd.session(params)
        feeds = {t.name: np.zeros(t.shape, np.int32 if t.dtype == "i32" else
                                  (np.int64 if t.dtype == "i64" else (np.float64 if t.dtype == "f64" else np.float32)))
                 for t in fwd.inputs}
        rng = np.random.default_rng(seed)
        out = bytearray(text)
        for _ in range(max_tokens):
            ctx = ids[-T:]
            w = np.zeros((B, T), np.int32)
            w[:, :len(ctx)] = ctx
            feeds[tok.name] = w
            logits = sess.run(feeds).outputs["logits"]
            row = np.asarray(logits[0, len(ctx) - 1], np.float64)[:len(byte_of)]
            if temperature == 0:
                nxt = int(np.argmax(row))
            else:
                order = np.lexsort((np.arange(row.size), -row))  # by logit, ties by the lower id
                k = top_k if 0 < top_k < row.size else row.size
                top = order[:k]
                wts = np.exp((row[top] - row[top[0]]) / temperature)
                nxt = int(top[rng.choice(k, p=wts / wts.sum())])
            ids.append(nxt)
            out.append(byte_of[nxt])
        return bytes(out)


def _compile_options(defines, gas, target, threads, no_cache, forward_only=False, precision=None):
    o = _lib.CompileOptions()
    _lib.compile_options_init(ctypes.byref(o))
    o.gas = int(gas)
    o.forward_only = 1 if forward_only else 0
    o.threads = int(threads)
    o.no_cache = 1 if no_cache else 0
    keep = [target.encode()]
    o.target = keep[0]
    if precision is not None:
        keep.append(str(precision).encode())
        o.precision = keep[-1]
    if defines:
        names = (ctypes.c_char_p * len(defines))(*[str(k).encode() for k in defines])
        values = (ctypes.c_int64 * len(defines))(*[int(v) for v in defines.values()])
        o.def_names, o.def_values, o.ndefs = names, values, len(defines)
        keep += [names, values]
    return o, keep


def _is_artifact(path):
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"GRADCART"
    except OSError:
        return False


def compile(path_or_source, defines=None, gas=1, target="cpu", threads=0, no_cache=False, name=None,
            forward_only=False, precision=None):
    """Compile a model: a path to a .gdl file (or an artifact, which is
    loaded), or the model's source text (anything with a newline or a
    '{'); name is the file name diagnostics give source text (default
    "<source>.gdl").  defines: -D values {"B": 64}; gas: micro-batches K;
    forward_only: the forward alone (as `gradc infer`: no gradients, no
    optimiser steps);
    precision: "bf16" or "f16" for mixed precision (PyTorch autocast's
    split: GEMMs in the low type, the rest and the params f32), None or
    "f32" for f32."""
    src = os.fspath(path_or_source) if isinstance(path_or_source, os.PathLike) else path_or_source
    if not isinstance(src, str):
        raise TypeError("gradc.compile: a path or source text, not %s" % type(src).__name__)
    o, keep = _compile_options(defines, gas, target, threads, no_cache, forward_only, precision)
    h = ctypes.c_void_p()
    if "\n" in src or "{" in src:
        _check(_lib.program_compile_source((name or "<source>.gdl").encode(), src.encode(), ctypes.byref(o), ctypes.byref(h)))
    elif _is_artifact(src):
        return load(src)
    else:
        _check(_lib.program_compile_file(src.encode(), ctypes.byref(o), ctypes.byref(h)))
    del keep
    prog = Program(h.value)
    if not forward_only:
        prog._recompile = lambda: compile(path_or_source, defines, gas, target, threads, no_cache, name, True, precision)
    return prog


def load(path):
    """Load an artifact (gradc compile -o / Program.save) without compiling."""
    h = ctypes.c_void_p()
    _check(_lib.program_load(_b(path), ctypes.byref(h)))
    return Program(h.value)


class _Storage:
    """Hands NumPy a session's own param storage (__array_interface__),
    and keeps the session alive while a view of it is."""

    def __init__(self, sess, ptr, shape, typestr):
        self._sess = sess
        self.__array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr, "version": 3}


class Result:
    """One window's values: losses (name -> float, "total" included),
    grads (name -> ndarray, copies; None from a forward-only program) and
    outputs (name -> ndarray, the model's `output` statements)."""

    def __init__(self, losses, grads, outputs):
        self.losses, self.grads, self.outputs = losses, grads, outputs

    def __repr__(self):
        return "Result(losses=%r)" % (self.losses,)


_OPTIMIZERS = {"sgd": _lib.SGD, "adamw": _lib.ADAMW}


class Session:
    """Params, one window of inputs, the last run's results and the
    optimiser state (gradc_session)."""

    def __init__(self, prog):
        self.program = prog  # freed after the session
        h = ctypes.c_void_p()
        _check(_lib.session_new(prog._h, ctypes.byref(h)))
        self._h = h.value
        self._info = {p.name: p for p in prog.params}

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.session_free(h)

    # ---- params ----
    def _view(self, name):
        ptr, n = ctypes.c_void_p(), ctypes.c_size_t()
        _check(_lib.session_param_data(self._h, name.encode(), ctypes.byref(ptr), ctypes.byref(n)))
        f64 = self._info[name].dtype == "f64"
        return np.asarray(_Storage(self, ptr.value, self._info[name].shape, "<f8" if f64 else "<f4"))

    @property
    def params(self):
        """name -> ndarray: views of the session's own storage (F32 master
        weights, F64 for f64 params), not copies.  They see every later
        change (steps, loads); writing into them changes the params."""
        return {p.name: self._view(p.name) for p in self.program.params}

    def set_param(self, name, value):
        a = np.ascontiguousarray(_as_array(value), dtype=np.float64 if self._info[name].dtype == "f64" else np.float32) \
            if name in self._info else np.zeros(0, np.float32)
        _check(_lib.session_set_param(self._h, name.encode(), a.ctypes.data_as(ctypes.c_void_p), a.size))

    def load_params(self, params, partial=False):
        """Params from a safetensors path (a checkpoint too: its optim.*
        tensors are skipped), or a dict name -> array, holding every param
        and nothing else; with partial=True, some of them (the others keep
        their values).  Returns how many were loaded."""
        if isinstance(params, (str, os.PathLike)):
            if not partial:
                _check(_lib.session_load_params(self._h, _b(params)))
                return len(self._info)
            n = ctypes.c_int()
            _check(_lib.session_load_params_partial(self._h, _b(params), ctypes.byref(n)))
            return n.value
        names = set(self._info)
        extra = sorted(set(params) - names)
        missing = [p.name for p in self.program.params if p.name not in params]
        if extra:
            raise Error("gradc: error: params: '%s' is not a param of the model" % extra[0])
        if missing and not partial:
            raise Error("gradc: error: params: missing param '%s'" % missing[0])
        for k, v in params.items():
            self.set_param(k, v)
        return len(params)

    def save_params(self, path):
        _check(_lib.session_save_params(self._h, _b(path)))

    # ---- running ----
    def run(self, inputs):
        """One window (K micro-batches, gradients accumulated): inputs is a
        dict name -> array holding one window of every input."""
        for k, v in inputs.items():
            a = _as_array(v)
            if a.dtype in (np.float32, np.float64, np.int32, np.int64):
                a = np.ascontiguousarray(a)
            elif a.dtype.kind in "iub":
                a = np.ascontiguousarray(a, dtype=np.int32)
            else:
                a = np.ascontiguousarray(a, dtype=np.float32)
            dt = {np.dtype(np.float32): _lib.F32, np.dtype(np.float64): _lib.F64,
                  np.dtype(np.int32): _lib.I32, np.dtype(np.int64): _lib.I64}[a.dtype]
            _check(_lib.session_set_input(self._h, str(k).encode(), dt, a.ctypes.data_as(ctypes.c_void_p), a.size))
        _lib.session_params_written(self._h)  # the views may have been written
        _check(_lib.session_run(self._h))
        losses = {name: _lib.session_loss(self._h, i) for i, name in enumerate(self.program.losses)}
        losses["total"] = _lib.session_loss_total(self._h)
        grads = None  # a forward-only program has none
        if not self.program.forward_only:
            grads = {}
            for p in self.program.params:
                g = np.empty(p.shape, np.float64 if p.dtype == "f64" else np.float32)
                _check(_lib.session_get_grad(self._h, p.name.encode(), g.ctypes.data_as(ctypes.c_void_p), g.size))
                grads[p.name] = g
        return Result(losses, grads, self._outputs())

    def _outputs(self):
        """name -> ndarray of every `output` of the last run (one with a
        leading batch axis holds the whole window): float32 (float64 for
        f64 outputs), int32 for i32 and bool ones."""
        out = {}
        for name in self.program.outputs:
            ti = _lib.TensorInfo()
            _check(_lib.session_output_info(self._h, name.encode(), ctypes.byref(ti)))
            shape = tuple(ti.shape[i] for i in range(ti.rank))
            a = np.empty(shape, _NP[ti.dtype])
            _check(_lib.session_get_output(self._h, name.encode(), a.ctypes.data_as(ctypes.c_void_p), a.size))
            out[name] = a
        return out

    def save_grads(self, path):
        _check(_lib.session_save_grads(self._h, _b(path)))

    # ---- optimiser ----
    def step(self, optimizer="adamw", lr=None, **kw):
        """One optimiser step with the last run's gradients (torch.optim
        semantics and defaults): optimizer "adamw" or "sgd"; lr; momentum,
        dampening, nesterov (SGD); betas=(b1, b2), eps (AdamW);
        weight_decay, clip_norm, warmup_steps, total_steps, min_lr;
        schedule "constant", "linear" or "cosine" (default: cosine when
        total_steps is given); no_decay_1d (no weight decay on params of
        rank <= 1) and no_decay (fnmatch patterns of names, a list or one
        comma-separated string).  A changed optimizer starts fresh state."""
        if optimizer not in _OPTIMIZERS:
            raise Error("gradc: error: step: unknown optimizer '%s' (sgd or adamw)" % optimizer)
        o = _lib.OptimizerOptions()
        _lib.optimizer_options_init(ctypes.byref(o), _OPTIMIZERS[optimizer])
        if lr is not None:
            o.lr = lr
        if "betas" in kw:
            o.beta1, o.beta2 = kw.pop("betas")
        if "schedule" in kw:
            sched = kw.pop("schedule")
            if sched not in _lib.SCHEDULES:
                raise Error("gradc: error: step: unknown schedule '%s' (constant, linear or cosine)" % sched)
            o.schedule = _lib.SCHEDULES[sched]
        keep = None
        if "no_decay" in kw:
            pats = kw.pop("no_decay")
            keep = (pats if isinstance(pats, str) else ",".join(pats)).encode()
            o.no_decay = keep
        for k, v in kw.items():
            if k == "clip":
                k = "clip_norm"
            if k not in dict(_lib.OptimizerOptions._fields_) or k.startswith("_") or k in ("kind", "no_decay"):
                raise TypeError("step() got an unexpected keyword argument '%s'" % k)
            setattr(o, k, v)
        _check(_lib.session_set_optimizer(self._h, ctypes.byref(o)))  # copies no_decay
        del keep
        _check(_lib.session_step(self._h))

    @property
    def step_count(self):
        return _lib.session_step_count(self._h)

    @property
    def lr(self):
        """The rate the next step uses (NaN before an optimiser is set)."""
        return _lib.session_lr(self._h)

    @property
    def grad_norm(self):
        return _lib.session_grad_norm(self._h)

    # ---- the session's generator (saved in checkpoints; gradc train draws its data order from it) ----
    def rng_seed(self, seed):
        _lib.session_rng_seed(self._h, seed)

    def rng_next(self):
        """The next 64-bit draw of the session's generator (xoshiro256**)."""
        return _lib.session_rng_next(self._h)

    # ---- checkpoints ----
    def save_checkpoint(self, path):
        """Params, optimiser state (optim.<slot>.<param>), step and RNG."""
        _check(_lib.session_save_checkpoint(self._h, _b(path)))

    def load_checkpoint(self, path):
        _check(_lib.session_load_checkpoint(self._h, _b(path)))


# ---- safetensors, in NumPy ----
_ST = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "F16": np.float16,
       "I8": np.int8, "U8": np.uint8, "I16": np.int16, "BOOL": np.bool_}
_ST_NAME = {np.dtype(v): k for k, v in _ST.items()}


def read_safetensors(path):
    """A safetensors file as a dict name -> ndarray (and "__metadata__" ->
    dict when the file has one)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Error("gradc: error: %s: not a safetensors file" % path)
    (n,) = struct.unpack("<Q", data[:8])
    try:
        head = json.loads(data[8:8 + n])
    except ValueError:
        raise Error("gradc: error: %s: not a safetensors file" % path) from None
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            out[name] = t
            continue
        if t["dtype"] not in _ST:
            raise Error("gradc: error: %s: tensor '%s': dtype %s is not read here" % (path, name, t["dtype"]))
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + lo:8 + n + hi], dtype=_ST[t["dtype"]]).reshape(t["shape"]).copy()
    return out


def write_safetensors(path, tensors, metadata=None):
    """Write a dict name -> array as a safetensors file."""
    head, blobs, off = {}, [], 0
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, v in tensors.items():
        a = np.ascontiguousarray(_as_array(v))
        if a.dtype not in _ST_NAME:
            raise Error("gradc: error: %s: tensor '%s': dtype %s cannot be written" % (path, name, a.dtype))
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        head[name] = {"dtype": _ST_NAME[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

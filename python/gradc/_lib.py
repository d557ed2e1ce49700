"""The C API of include/gradc.h through ctypes: finding libgradc.so and
declaring the functions the package calls.

libgradc.so is looked for, in order: the file (or the directory holding
it) that $GRADC_LIB names; beside this package (a wheel or a copy may put
it there); the build folders of the source tree this package sits in
(build/, then build-*/); the dynamic linker's path (an installed gradc).
"""
import ctypes
import ctypes.util
import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_SONAMES = ("libgradc.so", "libgradc.so.0.1")


def _candidates():
    env = os.environ.get("GRADC_LIB")
    if env:
        # Only what it names: a GRADC_LIB that points nowhere is an error,
        # not a reason to pick up another build.
        if os.path.isdir(env):
            return [os.path.join(env, n) for n in _SONAMES]
        return [env]
    out = [os.path.join(_HERE, n) for n in _SONAMES]
    root = os.path.dirname(os.path.dirname(_HERE))  # python/gradc -> the source tree
    for d in [os.path.join(root, "build")] + sorted(glob.glob(os.path.join(root, "build-*"))):
        out.append(os.path.join(d, "libgradc.so"))
    found = ctypes.util.find_library("gradc")
    out += [found] if found else []
    out += list(_SONAMES)  # the dynamic linker's own search (LD_LIBRARY_PATH, ld.so.cache)
    return out


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("gradc: libgradc.so not found; set GRADC_LIB to its path (tried: %s)" % "; ".join(tried))


lib, path = _load()

c_int, c_int64, c_uint64, c_double, c_size_t = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double, ctypes.c_size_t
c_char_p, c_void_p, POINTER = ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER

# gradc_dtype
F32, F64, BF16, F16, I32, I64 = range(6)
# gradc_optimizer_kind
SGD, ADAMW = 0, 1
# gradc_schedule
SCHEDULES = {"auto": 0, "constant": 1, "linear": 2, "cosine": 3}

# Room after each options struct's known fields: the library's *_init
# writes every field it has, so a library that grew fields at the end is
# still called correctly.
_SPARE = [("_spare", ctypes.c_char * 512)]


class CompileOptions(ctypes.Structure):
    _fields_ = [
        ("gas", c_int),
        ("target", c_char_p),
        ("threads", c_int),
        ("def_names", POINTER(c_char_p)),
        ("def_values", POINTER(c_int64)),
        ("ndefs", c_int),
        ("no_cache", c_int),
        ("dp", c_int),
        ("tp", c_int),
        ("sequence_parallel", c_int),
        ("no_overlap", c_int),
        ("bucket_bytes", c_int64),
        ("zero1", c_int),
        ("no_training", c_int),
        ("forward_only", c_int),
        ("no_outputs", c_int),
        ("precision", c_char_p),
    ] + _SPARE


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_int),
        ("rank", c_int),
        ("shape", c_int64 * 8),
        ("batched", c_int),
    ] + _SPARE


class OptimizerOptions(ctypes.Structure):
    _fields_ = [
        ("kind", c_int),
        ("lr", c_double),
        ("momentum", c_double),
        ("dampening", c_double),
        ("nesterov", c_int),
        ("beta1", c_double),
        ("beta2", c_double),
        ("eps", c_double),
        ("weight_decay", c_double),
        ("clip_norm", c_double),
        ("warmup_steps", c_int64),
        ("total_steps", c_int64),
        ("min_lr", c_double),
        ("schedule", c_int),
        ("no_decay_1d", c_int),
        ("no_decay", c_char_p),
    ] + _SPARE


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


P = c_void_p  # opaque handles
last_error = _fn("gradc_last_error", c_char_p)
version = _fn("gradc_version", c_char_p)
compile_options_init = _fn("gradc_compile_options_init", None, POINTER(CompileOptions))
program_compile_file = _fn("gradc_program_compile_file", c_int, c_char_p, POINTER(CompileOptions), POINTER(P))
program_compile_source = _fn("gradc_program_compile_source", c_int, c_char_p, c_char_p, POINTER(CompileOptions), POINTER(P))
program_load = _fn("gradc_program_load", c_int, c_char_p, POINTER(P))
program_save = _fn("gradc_program_save", c_int, P, c_char_p)
program_free = _fn("gradc_program_free", None, P)
program_num_params = _fn("gradc_program_num_params", c_int, P)
program_num_inputs = _fn("gradc_program_num_inputs", c_int, P)
program_num_losses = _fn("gradc_program_num_losses", c_int, P)
program_param_info = _fn("gradc_program_param_info", c_int, P, c_int, POINTER(TensorInfo))
program_input_info = _fn("gradc_program_input_info", c_int, P, c_int, POINTER(TensorInfo))
program_loss_name = _fn("gradc_program_loss_name", c_char_p, P, c_int)
program_gas = _fn("gradc_program_gas", c_int, P)
program_num_outputs = _fn("gradc_program_num_outputs", c_int, P)
program_output_name = _fn("gradc_program_output_name", c_char_p, P, c_int)
program_forward_only = _fn("gradc_program_forward_only", c_int, P)
program_arena_bytes = _fn("gradc_program_arena_bytes", c_int64, P)
session_new = _fn("gradc_session_new", c_int, P, POINTER(P))
session_free = _fn("gradc_session_free", None, P)
session_init_params = _fn("gradc_session_init_params", c_int, P, c_uint64)
session_set_param = _fn("gradc_session_set_param", c_int, P, c_char_p, c_void_p, c_size_t)
session_get_param = _fn("gradc_session_get_param", c_int, P, c_char_p, c_void_p, c_size_t)
session_param_data = _fn("gradc_session_param_data", c_int, P, c_char_p, POINTER(c_void_p), POINTER(c_size_t))
session_params_written = _fn("gradc_session_params_written", None, P)
session_load_params = _fn("gradc_session_load_params", c_int, P, c_char_p)
session_load_params_partial = _fn("gradc_session_load_params_partial", c_int, P, c_char_p, POINTER(c_int))
session_save_params = _fn("gradc_session_save_params", c_int, P, c_char_p)
session_set_input = _fn("gradc_session_set_input", c_int, P, c_char_p, c_int, c_void_p, c_size_t)
session_run = _fn("gradc_session_run", c_int, P)
session_loss = _fn("gradc_session_loss", c_double, P, c_int)
session_loss_total = _fn("gradc_session_loss_total", c_double, P)
session_output_info = _fn("gradc_session_output_info", c_int, P, c_char_p, POINTER(TensorInfo))
session_get_output = _fn("gradc_session_get_output", c_int, P, c_char_p, c_void_p, c_size_t)
session_get_grad = _fn("gradc_session_get_grad", c_int, P, c_char_p, c_void_p, c_size_t)
session_save_grads = _fn("gradc_session_save_grads", c_int, P, c_char_p)
optimizer_options_init = _fn("gradc_optimizer_options_init", None, POINTER(OptimizerOptions), c_int)
session_set_optimizer = _fn("gradc_session_set_optimizer", c_int, P, POINTER(OptimizerOptions))
session_step = _fn("gradc_session_step", c_int, P)
session_step_count = _fn("gradc_session_step_count", c_int64, P)
session_lr = _fn("gradc_session_lr", c_double, P)
session_grad_norm = _fn("gradc_session_grad_norm", c_double, P)
session_rng_next = _fn("gradc_session_rng_next", c_uint64, P)
session_rng_seed = _fn("gradc_session_rng_seed", None, P, c_uint64)
session_save_checkpoint = _fn("gradc_session_save_checkpoint", c_int, P, c_char_p)
session_load_checkpoint = _fn("gradc_session_load_checkpoint", c_int, P, c_char_p)

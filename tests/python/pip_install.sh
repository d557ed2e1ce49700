#!/bin/sh
# pip_install.sh PYTHON SOURCE BUILD - `pip install ./python` works: into a
# fresh virtual environment (with the system's site packages, for NumPy;
# offline, with the system's setuptools), from a copy of python/ so the
# source tree stays clean; then the installed package, found through
# GRADC_LIB, compiles and runs examples/mlp.gdl, and without GRADC_LIB it
# says how to find libgradc.so.
set -eu
py=$1
src=$2
build=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradc-pip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

"$py" -m venv --system-site-packages "$tmp/venv"
cp -r "$src/python" "$tmp/python"
"$tmp/venv/bin/python" -m pip install -q --no-index --no-build-isolation --no-deps "$tmp/python" >"$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; echo "pip_install.sh: pip install ./python failed" >&2; exit 1; }
cd "$tmp"
GRADC_LIB="$build/libgradc.so" "$tmp/venv/bin/python" - "$src/examples/mlp.gdl" <<'PY'
import sys
import numpy as np
import gradc
assert "/venv/" in gradc.__file__, gradc.__file__
prog = gradc.compile(sys.argv[1], defines={"B": 4})
r = prog.session(seed=0).run({"x": np.ones((4, 784), np.float32), "y": np.arange(4, dtype=np.int32)})
print("installed gradc %s from %s: loss total %.6f" % (gradc.version(), gradc.__file__, r.losses["total"]))
assert 2.0 < r.losses["total"] < 2.6
PY
if env -u GRADC_LIB LD_LIBRARY_PATH= "$tmp/venv/bin/python" -c "import gradc" >"$tmp/nolib.log" 2>&1; then
  # an installed gradc on the linker's path is found: that is fine too
  echo "libgradc.so found on the dynamic linker's path"
else
  grep -q "libgradc.so not found; set GRADC_LIB" "$tmp/nolib.log" ||
    { cat "$tmp/nolib.log"; echo "pip_install.sh: no hint without GRADC_LIB" >&2; exit 1; }
fi
echo ok

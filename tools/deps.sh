#!/bin/sh
# deps.sh [--list | --install] - the Debian 12 packages gradc's build, its
# test suite and the demo need: one list, read by the Makefile (make demo,
# make check) and by .ci/run.
#
#   deps.sh            install what is missing: as root with apt-get; as
#                      anyone else, print the exact command and exit 1.
#                      On a system without dpkg it checks nothing (CMake
#                      then says what it cannot find).
#   deps.sh --list     print the packages, one line
#   deps.sh --install  apt-get update and install all of them (root)
set -eu

# A C compiler, CMake and pkg-config; cJSON; cmocka (unit tests); FileCheck
# (llvm-19-tools); LLVM 19 (the CPU back end); OpenBLAS, oneDNN and BLIS
# (the GEMM providers, runtime/cpu/gemm.h; oneDNN and BLIS optional); Open MPI (the
# distributed tests run mpirun); clang (make fuzz); Python 3 with NumPy, venv
# and setuptools
# (the python/ package's tests).
packages="build-essential cmake pkg-config python3 python3-numpy python3-venv python3-setuptools libcmocka-dev libcjson-dev llvm-19-dev llvm-19-tools libopenblas-dev libdnnl-dev libblis-dev clang libopenmpi-dev openmpi-bin"

install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $1 >/dev/null
}

case "${1:-}" in
--list) echo "$packages"; exit 0 ;;
--install) install "$packages"; exit 0 ;;
"") ;;
*) echo "usage: tools/deps.sh [--list | --install]" >&2; exit 2 ;;
esac

command -v dpkg-query >/dev/null 2>&1 || exit 0
missing=""
for p in $packages; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
missing=${missing# }
if [ "$(id -u)" -eq 0 ]; then
  echo "== installing the Debian packages the build needs: $missing"
  install "$missing"
else
  echo "gradc: error: the build needs these Debian packages: $missing" >&2
  echo "gradc: install them with: sudo apt-get install -y --no-install-recommends $missing" >&2
  exit 1
fi

#!/usr/bin/env bash
# Installs the system packages burstctl's tests need (libfuse 2 and 3, fio, and Chromium with its
# WebDriver for the dashboard test, shellcheck for the deploy scripts' test, gcc and the libc headers
# that build the LD_PRELOAD library, preload_shim/*.c, Python's headers for the modules setup.py
# compiles, Open MPI's mpirun for the MPI workloads' tests, and Prometheus with promtool for the
# tests of deploy/prometheus/) when missing.
# Runs apt-get only as root (CI runs as root on a fresh machine); otherwise says what to install.
set -euo pipefail

missing=()
command -v fio >/dev/null 2>&1 || missing+=(fio)
command -v fusermount >/dev/null 2>&1 || missing+=(fuse)
ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2' || missing+=(libfuse2)
# The library only: the fuse3 package (fusermount3) would replace fuse; the tests mount as root.
ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3' || missing+=(libfuse3-3)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
# Open MPI itself (mpirun and the libraries PyPI's mpi4py wheel loads), not another MPI's mpirun:
# the tests use Open MPI's options. No headers: nothing is built against it.
command -v ompi_info >/dev/null 2>&1 || missing+=(openmpi-bin)
"${PYTHON:-python3}" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
# Apart: installed without its recommends (prometheus-node-exporter), and never started.
prometheus=()
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || prometheus=(prometheus)

if [ ${#missing[@]} -eq 0 ] && [ ${#prometheus[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${missing[*]} ${prometheus[*]} (run: sudo apt-get install -y fuse libfuse2 libfuse3-3 fio chromium chromium-driver shellcheck gcc libc6-dev python3-dev openmpi-bin; sudo apt-get install -y --no-install-recommends prometheus)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing system packages: fuse libfuse2 libfuse3-3 fio chromium chromium-driver shellcheck gcc libc6-dev python3-dev openmpi-bin"
  apt-get install -y -qq fuse libfuse2 libfuse3-3 fio chromium chromium-driver shellcheck gcc libc6-dev python3-dev openmpi-bin >/dev/null
fi
if [ ${#prometheus[@]} -gt 0 ]; then
  echo "installing system packages: prometheus (the server and promtool; its service left stopped)"
  # The tests start Prometheus servers of their own: the package's service must not start
  # (nor hold port 9090). A policy-rc.d that refuses stops its postinst starting it, under
  # systemd as under invoke-rc.d; one the host already has is left as it is.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # ... nor start at the next boot.
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable prometheus.service >/dev/null 2>&1 || true
  fi
fi

#!/bin/sh
# setup.sh: install what dtrain needs from Debian's archive, then build it in place.
#   ./setup.sh            packages + build (uses sudo when not root)
#   DT_NO_APT=1 ./setup.sh   build only
set -e
cd "$(dirname "$0")"
PKGS="build-essential autoconf automake libtool pkg-config libopenblas-dev libsodium-dev zlib1g-dev \
libopenmpi-dev openmpi-bin dataset-fashion-mnist python3 gnuplot-nox"
if [ -z "${DT_NO_APT:-}" ]; then
    if [ "$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
fi
./autogen.sh
[ -f Makefile ] || ./configure --quiet
make -j"$(nproc)" >/dev/null
echo "setup.sh: built ./dtrain, ./dtrun and ./dtbench"

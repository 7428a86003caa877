#!/bin/sh
# Installs what libddp needs to build, test and train, from Debian's packages.
# Idempotent and quiet: does nothing when every package is already there.
# Usage: sh scripts/install-deps.sh [extra-package ...]
#   (MPICH, to build the mpi backend against it too: ... libmpich-dev)
set -eu
pkgs="build-essential clang pkg-config libopenblas-dev zlib1g-dev libcmocka-dev
dataset-fashion-mnist iproute2 procps openmpi-bin libopenmpi-dev libclang-rt-14-dev nftables $*"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null

#!/bin/sh
# Compile a CO-RE BPF object: once, with clang; libbpf relocates it against the running
# kernel's BTF when it is loaded. The one definition of how, used by `make` and by the wheel's
# build hook (hatch_build.py), so that what ships is what is tested.
#   agent/ebpf/build.sh SOURCE.bpf.c OBJECT.bpf.o
set -eu
arch=$(uname -m)
case "$arch" in
  x86_64) target=x86 ;;
  aarch64) target=arm64 ;;
  *) target=$arch ;;
esac
exec clang -g -O2 -target bpf "-D__TARGET_ARCH_${target}" "-I/usr/include/${arch}-linux-gnu" \
  -Wall -Werror -c "$1" -o "$2"

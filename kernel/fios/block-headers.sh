#!/bin/sh
# Extract the block layer's private headers (block/*.h: elevator.h, blk-mq.h, blk-mq-sched.h,
# blk.h, ...) that every I/O scheduler needs and Debian's linux-headers does not ship, from
# Debian's linux-source tarball of the very same version.
#
#   block-headers.sh OUTDIR [TARBALL [KERNELVER]]
#
# OUTDIR/block/*.h is written. TARBALL defaults to /usr/src/linux-source-6.1.tar.xz (package
# linux-source-6.1). With KERNELVER (dkms passes it), the installed linux-source-6.1 and
# linux-headers-KERNELVER must be the same Debian version: struct layouts in these headers
# change between kernel releases, so a mismatch is refused rather than built.
set -eu
out=${1:?usage: block-headers.sh OUTDIR [TARBALL [KERNELVER]]}
tarball=${2:-/usr/src/linux-source-6.1.tar.xz}
kernelver=${3:-}

if [ ! -f "$tarball" ]; then
	echo "fios: $tarball not found; install linux-source-6.1 of the same version as" \
		"linux-headers-$(uname -r)" >&2
	exit 1
fi
if [ -n "$kernelver" ] && command -v dpkg-query >/dev/null; then
	source_version=$(dpkg-query -W -f='${Version}' linux-source-6.1 2>/dev/null || true)
	headers_version=$(dpkg-query -W -f='${Version}' "linux-headers-$kernelver" 2>/dev/null || true)
	if [ "$source_version" != "$headers_version" ]; then
		echo "fios: linux-source-6.1 is '$source_version' but linux-headers-$kernelver is" \
			"'$headers_version'; install matching versions" >&2
		exit 1
	fi
fi
mkdir -p "$out"
tar -C "$out" -xJf "$tarball" --wildcards --strip-components=1 'linux-source-*/block/*.h'
if [ ! -f "$out/block/elevator.h" ]; then
	echo "fios: $tarball has no block/elevator.h" >&2
	exit 1
fi

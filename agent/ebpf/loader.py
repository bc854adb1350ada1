"""Loading a CO-RE BPF object with the system's libbpf (libbpf.so.1) through ctypes, attaching
its programs and reading its hash maps.

Why this way: the agent's footprint. bcc needs LLVM and kernel headers on the node and compiles
the C when it starts; bpftrace as a child process carries LLVM too. libbpf is a 350 kB shared
library (Debian's libbpf1), the object is compiled once, and the agent reads the maps itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

LIBBPF_NAMES = ("libbpf.so.1", "libbpf.so")


class BpfUnavailable(RuntimeError):
    """eBPF cannot run here; the message says why (privilege, BTF, library, object)."""


def libbpf() -> ctypes.CDLL:
    """The system's libbpf (libbpf.so.1), its functions typed; BpfUnavailable without it."""
    return _libbpf()


def _libbpf() -> ctypes.CDLL:
    for name in (*LIBBPF_NAMES, ctypes.util.find_library("bpf")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            continue
        vp = ctypes.c_void_p
        lib.bpf_object__open_file.restype = vp
        lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, vp]
        lib.bpf_object__load.argtypes = [vp]
        lib.bpf_object__next_program.restype = vp
        lib.bpf_object__next_program.argtypes = [vp, vp]
        lib.bpf_program__attach.restype = vp
        lib.bpf_program__attach.argtypes = [vp]
        lib.bpf_program__name.restype = ctypes.c_char_p
        lib.bpf_program__name.argtypes = [vp]
        lib.bpf_link__destroy.argtypes = [vp]
        lib.bpf_object__close.argtypes = [vp]
        lib.bpf_object__find_map_fd_by_name.argtypes = [vp, ctypes.c_char_p]
        lib.bpf_map_get_next_key.argtypes = [ctypes.c_int, vp, vp]
        lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, vp, vp]
        lib.libbpf_set_print.restype = vp
        lib.libbpf_set_print.argtypes = [vp]
        return lib
    raise BpfUnavailable("libbpf is not installed (Debian: libbpf1)")


def _error(what: str) -> BpfUnavailable:
    number = ctypes.get_errno()
    reason = os.strerror(number) if number else "unknown error"
    if number in (1, 13):  # EPERM, EACCES
        reason += " (eBPF needs root, or CAP_BPF and CAP_PERFMON)"
    return BpfUnavailable(f"{what}: {reason}")


class BpfObject:
    """An opened, loaded and attached BPF object; `close()` detaches everything."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise BpfUnavailable(f"{path} is missing (built by `make`; clang and libbpf-dev)")
        self.lib = _libbpf()
        self.lib.libbpf_set_print(None)  # libbpf's own chatter stays out of the agent's log
        self.obj = self.lib.bpf_object__open_file(str(path).encode(), None)
        if not self.obj:
            raise _error(f"cannot open {path}")
        self.links: list[int] = []
        # programs stay attached while their links are open: an object dropped without
        # close() (a test's agent, an exception) must not keep tracing every I/O
        self._finalizer = weakref.finalize(self, _release, self.lib, self.links, self.obj)
        try:
            if self.lib.bpf_object__load(self.obj) != 0:
                raise _error("the kernel refused to load the BPF programs")
            prog = self.lib.bpf_object__next_program(self.obj, None)
            while prog:
                link = self.lib.bpf_program__attach(prog)
                if not link:
                    name = self.lib.bpf_program__name(prog).decode()
                    raise _error(f"cannot attach {name}")
                self.links.append(link)
                prog = self.lib.bpf_object__next_program(self.obj, prog)
        except BaseException:
            self.close()
            raise

    def map_fd(self, name: str) -> int:
        fd = int(self.lib.bpf_object__find_map_fd_by_name(self.obj, name.encode()))
        if fd < 0:
            raise BpfUnavailable(f"the BPF object has no map {name!r}")
        return fd

    def items(
        self,
        fd: int,
        key_type: type[ctypes.Structure],
        value_type: type[ctypes.Structure],
        wanted: Callable[[ctypes.Structure], bool] | None = None,
    ) -> Iterator[tuple[ctypes.Structure, ctypes.Structure]]:
        """Every (key, value) of a hash map, as copies; only the keys `wanted` says so of, if
        given (the others' values are not read)."""
        key, following = key_type(), key_type()
        first = True
        while True:
            previous = None if first else ctypes.byref(key)
            if self.lib.bpf_map_get_next_key(fd, previous, ctypes.byref(following)) != 0:
                return
            first = False
            ctypes.memmove(ctypes.byref(key), ctypes.byref(following), ctypes.sizeof(key))
            if wanted is not None and not wanted(key):
                continue
            value = value_type()
            if self.lib.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(value)) == 0:
                copy = key_type()
                ctypes.memmove(ctypes.byref(copy), ctypes.byref(key), ctypes.sizeof(key))
                yield copy, value

    def close(self) -> None:
        self._finalizer()
        self.obj = None


def _release(lib: ctypes.CDLL, links: list[int], obj: int | None) -> None:
    for link in links:
        lib.bpf_link__destroy(link)
    links.clear()
    if obj:
        lib.bpf_object__close(obj)

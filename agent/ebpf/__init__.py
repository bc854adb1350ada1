"""The agent's eBPF programs (C, compiled once with clang into CO-RE objects) and their loader
(libbpf through ctypes: no compiler, no Python extension and no second process on the node)."""

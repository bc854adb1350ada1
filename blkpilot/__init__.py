"""blkpilot: an auto-tuning control plane for Linux block I/O."""

__version__ = "0.1.0"

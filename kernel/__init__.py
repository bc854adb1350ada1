"""The kernel side of blkpilot: FIOS, the flash-like test device, and the QEMU lab."""

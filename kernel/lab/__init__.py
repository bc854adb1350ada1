"""The kernel lab: Debian's own 6.1 kernel booted under QEMU (TCG) with an initramfs that
holds the modules, fio and a scenario; results come back on the serial console."""

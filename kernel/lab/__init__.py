"""The lab: this host's loop devices made for experiments (`devices`), and Debian's own 6.1
kernel booted under QEMU (TCG) with an initramfs that holds the modules, fio and a scenario,
results coming back on the serial console (the other modules). The grids measured on both live
in bench/grid/."""

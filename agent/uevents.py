"""The kernel's device announcements (uevents, NETLINK_KOBJECT_UEVENT): the agent hears a block
device added or changed the moment the kernel says so — a disk hot-plugged, a device back after
a reset, a loop device re-attached — and gives it its policy back then, not at its next policy
check. The kernel's own messages are read (group 1), so it works where no udev daemon runs;
where one does, it hears the same events first and may apply its rules before the agent does
(agent.owners: the owner policy decides who wins)."""

from __future__ import annotations

import logging
import select
import socket

log = logging.getLogger(__name__)

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1


class Uevents:
    def __init__(self) -> None:
        self.socket: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
            sock.bind((0, KERNEL_GROUP))
            sock.setblocking(False)
        except OSError as error:  # no netlink here (a sandbox): the policy check still runs
            log.warning("device announcements unavailable (%s): policies return at the next check",
                        error)  # fmt: skip
            return
        self.socket = sock

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None

    def wait(self, timeout: float) -> bool:
        """Until an announcement is pending or timeout seconds; whether one is."""
        if self.socket is None:
            return False
        ready, _, _ = select.select([self.socket], [], [], max(0.0, timeout))
        return bool(ready)

    def block_devices(self) -> set[str]:
        """The whole block devices added or changed since the last call, by name."""
        found: set[str] = set()
        while self.socket is not None:
            try:
                message = self.socket.recv(65536)
            except BlockingIOError:
                break
            except OSError as error:  # the kernel dropped messages (ENOBUFS): none lost here
                log.warning("device announcements: %s", error)
                break
            found |= _announced(message)
        return found


def _announced(message: bytes) -> set[str]:
    head, *fields = message.split(b"\0")
    action = head.split(b"@", 1)[0]
    if action not in (b"add", b"change"):
        return set()
    values = dict(field.split(b"=", 1) for field in fields if b"=" in field)
    if values.get(b"SUBSYSTEM") != b"block" or values.get(b"DEVTYPE") != b"disk":
        return set()
    name = values.get(b"DEVNAME", b"").decode(errors="replace").removeprefix("/dev/")
    return {name} if name and "/" not in name else set()

"""Who else sets a block device's queue attributes: udev rules and the active TuneD profile.

Read from their files, so that the agent can say "owned by: udev rule 60-ioschedulers.rules
(scheduler=bfq)" before it applies anything, and an operator can decide whether blkpilot yields
or takes over.

udev rules (`usr/lib/udev/rules.d`, `run/udev/rules.d`, `etc/udev/rules.d`; a file of the same
name in a later directory replaces the earlier one, files run in name order) are read line by
line: a line that assigns `ATTR{queue/…}` applies to the device when every match key on it
matches. What is matched here: ACTION (an add or a change), SUBSYSTEM (block), KERNEL (the
device's name), DEVPATH, ENV{DEVTYPE} (disk), ATTR{…} (the device's own sysfs attribute), and
any ENV{…} that udev's database (`run/udev/data/b<major>:<minor>`) holds for the device. A line
whose other keys (a parent's ATTRS, a PROGRAM, a TEST) cannot be judged here may apply: it is
reported as not certain. GOTO and LABEL are not followed (a rule skipped by a GOTO is reported
as it would apply without it). Where two lines set the same attribute, the later one is what
the device ends with.

TuneD: the profiles named in `etc/tuned/active_profile`, each read from `etc/tuned/<name>` or
else `usr/lib/tuned/<name>` with the profiles it includes (`include=` in [main], read first);
a [disk] section, or any section with `type=disk`, whose `devices=` matches the device (all
devices where unset; globs, and `!` to exclude) sets `elevator` → scheduler and `readahead`
→ read_ahead_kb (KiB, or sectors with an `s` suffix; `>` means only raised to it).
"""

from __future__ import annotations

import configparser
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from agent.contract.wire import Owner, OwnerKind
from agent.host import HostPaths, read_text

# udev: KEY or KEY{attribute}, an operator, a quoted value
_TOKEN = re.compile(
    r'\s*([A-Z_]+)(?:\{([^}]*)\})?\s*(==|!=|\+=|-=|:=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?'
)
_ASSIGN = ("=", ":=", "+=")
_MATCH = ("==", "!=")


@dataclass(frozen=True)
class _Device:
    name: str
    attributes: Path  # /sys/block/<name>
    env: dict[str, str]  # from udev's database, where it has the device

    def attribute(self, name: str) -> str | None:
        text = read_text(self.attributes / name)
        return None if text is None else text.strip()


def owners(paths: HostPaths, device: str) -> list[Owner]:
    """Every other owner of the device's queue attributes: udev rules first, then TuneD."""
    found = _Device(device, paths.block / device, _udev_env(paths, device))
    return [*udev_owners(paths, found), *tuned_owners(paths, device)]


def _udev_env(paths: HostPaths, device: str) -> dict[str, str]:
    numbers = read_text(paths.block / device / "dev")
    env = {"DEVTYPE": "disk"}
    text = read_text(paths.run / "udev" / "data" / f"b{numbers}") if numbers else None
    for line in (text or "").splitlines():
        if line.startswith("E:") and "=" in line:
            key, _, value = line[2:].partition("=")
            env[key] = value
    return env


def _rule_files(paths: HostPaths) -> list[Path]:
    chosen: dict[str, Path] = {}
    for directory in (
        paths.lib / "udev" / "rules.d",
        paths.run / "udev" / "rules.d",
        paths.etc / "udev" / "rules.d",
    ):
        try:
            for file in directory.iterdir():
                if file.suffix == ".rules":
                    chosen[file.name] = file
        except OSError:
            continue
    return [chosen[name] for name in sorted(chosen)]


def _lines(text: str) -> list[tuple[int, str]]:
    """Logical lines (backslash continuations joined) with their first line's number."""
    found: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            found.append((start, line))
    return found


def _glob(pattern: str, value: str) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in pattern.split("|"))


def _matches(key: str, attribute: str | None, pattern: str, device: _Device) -> bool | None:
    """Whether one match key holds for the device; None where it cannot be told here."""
    if key == "ACTION":
        return _glob(pattern, "add") or _glob(pattern, "change")
    if key == "SUBSYSTEM":
        return _glob(pattern, "block")
    if key in ("KERNEL", "NAME"):
        return _glob(pattern, device.name)
    if key == "DEVPATH":
        return _glob(pattern, f"/devices/virtual/block/{device.name}") or None
    if key == "ATTR" and attribute:
        value = device.attribute(attribute)
        return None if value is None else _glob(pattern, value)
    if key == "ENV" and attribute:
        value = device.env.get(attribute)
        return None if value is None else _glob(pattern, value)
    return None


def _queue_setting(attribute: str) -> str | None:
    """ATTR{queue/scheduler} → scheduler, ATTR{queue/iosched/slice_idle} → iosched/slice_idle;
    ATTR{bdi/read_ahead_kb} → read_ahead_kb."""
    if attribute.startswith("queue/"):
        return attribute.removeprefix("queue/")
    if attribute == "bdi/read_ahead_kb":
        return "read_ahead_kb"
    return None


def udev_owners(paths: HostPaths, device: _Device) -> list[Owner]:
    last: dict[str, tuple[str, str, bool]] = {}  # setting -> (source, value, certain)
    for file in _rule_files(paths):
        try:
            text = file.read_text(errors="replace")
        except OSError:
            continue
        for number, line in _lines(text):
            tokens = _TOKEN.findall(line)
            sets = {
                setting: value
                for key, attribute, op, value in tokens
                if key == "ATTR" and op in _ASSIGN and (setting := _queue_setting(attribute))
            }
            if not sets:
                continue
            certain = True
            applies = True
            for key, attribute, op, value in tokens:
                if op not in _MATCH:
                    continue
                held = _matches(key, attribute, value, device)
                if held is None:
                    certain = False
                    continue
                if held != (op == "=="):
                    applies = False
                    break
            if applies:
                for setting, value in sets.items():
                    last[setting] = (f"{file.name}:{number}", value, certain)
    by_source: dict[tuple[str, bool], dict[str, str]] = {}
    for setting, (source, value, certain) in last.items():
        by_source.setdefault((source, certain), {})[setting] = value
    return [
        Owner(kind=OwnerKind.UDEV, source=source, settings=settings, certain=certain)
        for (source, certain), settings in by_source.items()
    ]


def _profile(paths: HostPaths, name: str, seen: set[str]) -> list[tuple[str, Path]]:
    """The profile's tuned.conf after those it includes, as (name, path), parents first."""
    if name in seen or not re.fullmatch(r"[\w.+-]+", name):
        return []
    seen.add(name)
    for base in (paths.etc / "tuned", paths.lib / "tuned"):
        file = base / name / "tuned.conf"
        if file.is_file():
            break
    else:
        return []
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(file)
    except configparser.Error:
        return [(name, file)]
    found: list[tuple[str, Path]] = []
    for parent in parser.get("main", "include", fallback="").replace(",", " ").split():
        found += _profile(paths, parent, seen)
    return [*found, (name, file)]


def _selected(devices: str | None, name: str) -> bool:
    """TuneD's `devices=`: every device where unset; else one of its patterns, and none of its
    `!` exclusions (only exclusions: every other device)."""
    if not devices:
        return True
    patterns = [p.strip() for p in devices.split(",") if p.strip()]
    if any(fnmatch.fnmatchcase(name, p[1:]) for p in patterns if p.startswith("!")):
        return False
    wanted = [p for p in patterns if not p.startswith("!")]
    return not wanted or any(fnmatch.fnmatchcase(name, p) for p in wanted)


def _readahead_kb(value: str) -> str:
    text = value.strip().lstrip(">").strip()
    number, _, unit = text.partition(" ")
    if not number.isdigit():
        return value.strip()
    kib = int(number) // 2 if unit.strip().startswith("s") else int(number)
    return f">{kib}" if value.strip().startswith(">") else str(kib)


def tuned_owners(paths: HostPaths, device: str) -> list[Owner]:
    """The active profiles' disk settings for the device. As TuneD merges them: a section of
    the same name in a profile and those it includes is one section, the including profile's
    options over its parents' (`replace=true` drops the parents' instead)."""
    active = read_text(paths.etc / "tuned" / "active_profile")
    found: list[Owner] = []
    for profile in (active or "").split():
        merged: dict[str, dict[str, str]] = {}
        where: dict[str, str] = {}  # section -> the profile whose file last set it
        for name, file in _profile(paths, profile, set()):
            parser = configparser.ConfigParser(interpolation=None, strict=False)
            try:
                parser.read(file)
            except configparser.Error:
                continue
            for section in parser.sections():
                options = dict(parser.items(section))
                if options.get("replace", "").lower() in ("1", "true", "yes", "y"):
                    merged[section] = {}
                merged.setdefault(section, {}).update(options)
                where[section] = name
        settings: dict[str, str] = {}
        sources: list[str] = []
        for section, options in merged.items():
            if options.get("type", section) != "disk" or not _selected(
                options.get("devices"), device
            ):
                continue
            if "elevator" in options:
                settings["scheduler"] = options["elevator"].strip()
            if "readahead" in options:
                settings["read_ahead_kb"] = _readahead_kb(options["readahead"])
            if "elevator" in options or "readahead" in options:
                sources.append(f"{where[section]}/tuned.conf [{section}]")
        if settings:
            source = f"{profile} ({', '.join(sources)})"
            found.append(Owner(kind=OwnerKind.TUNED, source=source[:255], settings=settings))
    return found

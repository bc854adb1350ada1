"""The agent's configuration: a TOML file (default /etc/blkpilot/agent.toml), every key optional."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.contract.sli import AppSli
from agent.host import HostPaths

DEFAULT_CONFIG = Path("/etc/blkpilot/agent.toml")

Seconds = Annotated[float, Field(gt=0, le=86_400)]


class PowerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rapl: bool = True
    hwmon: bool = True
    ipmi: bool | Literal["auto"] = "auto"  # auto: when ipmitool and /dev/ipmi* exist
    ipmi_command: list[str] = Field(
        default_factory=lambda: ["ipmitool", "dcmi", "power", "reading"]
    )
    ipmi_interval_s: Seconds = 10.0
    redfish_url: str | None = None  # e.g. https://bmc/redfish/v1/Chassis/1/Power
    redfish_username: str | None = None
    redfish_password_file: Path | None = None
    redfish_verify_tls: bool = True
    meter_csv: Path | None = None  # an external meter's log: timestamp,watts
    # CPU energy estimated from CPU time (scope "estimated"), used only where nothing measures
    estimate: bool = True
    estimate_active_watts: Annotated[float, Field(gt=0, le=1_000)] = 5.0  # per busy CPU
    estimate_idle_watts: Annotated[float, Field(ge=0, le=1_000)] = 1.0  # per idle CPU


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: Path | None = None  # default: the CLI's --state-dir
    interval_s: Seconds = 10.0  # one telemetry window per device per interval
    push_interval_s: Seconds = 30.0  # windows are batched, spooled and sent this often
    policy_interval_s: Seconds = 60.0  # desired policies fetched, drift checked
    # a device the kernel announces again (hot-plug, re-attached) gets its policy back at once
    hotplug: bool = True
    inventory_interval_s: Seconds = 600.0  # devices rediscovered and reported
    metrics_address: str = "127.0.0.1"
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] = 9477  # 0: no exporter
    devices: list[str] | None = None  # only these devices; default: every one discovered
    apply_policies: bool = True
    log_format: Literal["json", "text"] = "json"  # json: one object per line, with request ids
    calibrate_fios: bool = True  # measure fios' costs on scratch devices when a policy picks it
    calibration_seconds: Seconds = 2.0  # per calibration point (4 points)
    dry_run: bool = False  # log sysfs writes instead of making them
    spool_max_batches: Annotated[int, Field(ge=1)] = 50_000
    spool_max_bytes: Annotated[int, Field(ge=1 << 20)] = 256 << 20
    sys_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/dev")
    run_root: Path = Path("/run")  # where the host-wide device locks live (run/lock/blkpilot)
    etc_root: Path = Path("/etc")  # udev rules and TuneD's profile, as set on this host
    lib_root: Path = Path("/usr/lib")  # the distribution's udev rules and TuneD profiles
    power: PowerConfig = Field(default_factory=PowerConfig)
    disabled_collectors: list[str] = Field(default_factory=list)  # e.g. ["ipmi"]
    ebpf: bool = True  # per-I/O latency distributions from the block tracepoints
    ebpf_object: Path | None = None  # default: the object built beside agent/ebpf's source
    # the application SLI a live canary judges beside block latency, per device name ("*":
    # every device): used by scheduled (nightly) canaries and by `agent canary` without --sli-*;
    # a fleet names it per node label through the agent role's configuration
    sli: dict[str, AppSli] = Field(default_factory=dict)

    def sli_for(self, device: str) -> AppSli | None:
        return self.sli.get(device) or self.sli.get("*")

    @property
    def paths(self) -> HostPaths:
        return HostPaths(
            sys=self.sys_root,
            proc=self.proc_root,
            dev=self.dev_root,
            run=self.run_root,
            etc=self.etc_root,
            lib=self.lib_root,
        )

    @classmethod
    def load(cls, path: Path | None) -> AgentConfig:
        """The file if given (it must exist), else the default file if present, else defaults."""
        if path is None:
            if not DEFAULT_CONFIG.exists():
                return cls()
            path = DEFAULT_CONFIG
        with path.open("rb") as handle:
            return cls.model_validate(tomllib.load(handle))

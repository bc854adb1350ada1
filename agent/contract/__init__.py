"""The shared contract: what the agent, the service, the learning code and the operators'
tools agree on. The agent owns it; the others import it, and nothing else of the agent's.

- `wire`: the protocol's messages (enrollment, inventory, telemetry, observations, policies)
- `tunables`: the allow-list of sysfs attributes and ranges, and `DeviceConfig`
- `workloads`: the workload language (fio jobs, db_bench)
- `labels`: node labels, validated and parsed
- `base`: strict input models and shared bounds
"""

__version__ = "0.1.0"

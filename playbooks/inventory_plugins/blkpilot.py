# An Ansible inventory plugin: blkpilot's nodes, their labels and device groups, read from the
# service's REST API with an operator (or viewer) token. Self-contained: it needs only Ansible
# on the controller, not blkpilot.
from __future__ import annotations

DOCUMENTATION = r"""
    name: blkpilot
    short_description: blkpilot's fleet (nodes, labels, device groups) from its REST API
    description:
      - One host per enrolled node, named by its hostname.
      - Groups C(blkpilot) (every node), C(class_<device class>) (nodes with such a device) and
        C(label_<key>_<value>) (each node label).
      - Host variables C(blkpilot_node_id), C(blkpilot_labels), C(blkpilot_node_devices) (each
        present device - name, id, class, scheduler, whether it holds data) and
        C(blkpilot_device_groups) (device class -> device names).
      - The configuration file must end in C(blkpilot.yml) or C(blkpilot.yaml).
    extends_documentation_fragment:
      - constructed
    options:
      plugin:
        description: Must be C(blkpilot).
        required: true
        choices: [blkpilot]
      url:
        description: The service's base URL.
        required: true
        env:
          - name: BLKPILOT_URL
      token:
        description: An API token (viewer is enough).
        required: true
        env:
          - name: BLKPILOT_TOKEN
      validate_certs:
        description: Check the service's TLS certificate.
        type: bool
        default: true
      timeout:
        description: Seconds per request.
        type: int
        default: 30
      include_absent:
        description: Also list devices no longer on their node.
        type: bool
        default: false
"""

EXAMPLES = r"""
# inventory/blkpilot.yml
plugin: blkpilot
url: https://blkpilot.example:8000
# token from BLKPILOT_TOKEN
keyed_groups:
  - key: blkpilot_labels.rack | default('none')
    prefix: rack
"""

import json
import re
from typing import Any
from urllib.parse import urlencode

from ansible.errors import AnsibleParserError
from ansible.module_utils.urls import open_url
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable

PAGE = 1000


def _group_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


class InventoryModule(BaseInventoryPlugin, Constructable):
    NAME = "blkpilot"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith(("blkpilot.yml", "blkpilot.yaml"))

    def _get(self, path: str, **params: Any) -> list[dict[str, Any]]:
        """Every page of a list endpoint."""
        items: list[dict[str, Any]] = []
        base = self.get_option("url").rstrip("/") + "/api/v1" + path
        while True:
            query = urlencode({**params, "limit": PAGE, "offset": len(items)})
            try:
                response = open_url(
                    f"{base}?{query}",
                    headers={"Authorization": f"Bearer {self.get_option('token')}"},
                    validate_certs=self.get_option("validate_certs"),
                    timeout=self.get_option("timeout"),
                )
                page = json.loads(response.read())
            except Exception as error:
                raise AnsibleParserError(f"blkpilot: GET {base} failed: {error}") from error
            items.extend(page)
            if len(page) < PAGE:
                return items

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        nodes = self._get("/nodes")
        params = {} if self.get_option("include_absent") else {"present": "true"}
        devices = self._get("/devices", **params)
        by_node: dict[str, list[dict[str, Any]]] = {}
        for device in devices:
            by_node.setdefault(device["node_id"], []).append(device)
        names = [node["hostname"] for node in nodes]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise AnsibleParserError(f"blkpilot: more than one node is named {', '.join(twice)}")

        self.inventory.add_group("blkpilot")
        strict = self.get_option("strict")
        for node in sorted(nodes, key=lambda n: n["hostname"]):
            host = node["hostname"]
            self.inventory.add_host(host, group="blkpilot")
            own = sorted(by_node.get(node["id"], []), key=lambda d: d["name"])
            groups: dict[str, list[str]] = {}
            for device in own:
                groups.setdefault(device["device_class"], []).append(device["name"])
            variables = {
                "blkpilot_node_id": node["id"],
                "blkpilot_labels": node["labels"],
                "blkpilot_kernel": node["kernel_version"],
                "blkpilot_node_devices": [
                    {
                        "name": d["name"],
                        "id": d["id"],
                        "class": d["device_class"],
                        "scheduler": d["capabilities"].get("current_scheduler"),
                        "holds_data": d["holds_data"],
                        "present": d["present"],
                    }
                    for d in own
                ],
                "blkpilot_device_groups": groups,
            }
            for name, value in variables.items():
                self.inventory.set_variable(host, name, value)
            for device_class in groups:
                group = self.inventory.add_group(_group_name(f"class_{device_class}"))
                self.inventory.add_child(group, host)
            for key, value in node["labels"].items():
                group = self.inventory.add_group(_group_name(f"label_{key}_{value}"))
                self.inventory.add_child(group, host)
            self._set_composite_vars(self.get_option("compose"), variables, host, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), variables, host, strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), variables, host, strict)

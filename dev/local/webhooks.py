"""The resolver's webhook configurations on the local plane: deploy/webhook.yaml (the validating webhook on
bindings) and deploy/router.yaml (the mutating router), pointed at the local resolver by URL.

In a cluster each binding lane (hoss/model/admission.py) is its own webhook entry and so its own apiserver transport;
registered by URL, as here, the entries share one transport, whose idle connections are kept per host, so each lane
calls the resolver at a loopback address of its own.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hoss.model.admission import BINDING_LANES, LANE_LABEL

LANE_HOSTS = tuple(f"127.0.0.{lane + 1}" for lane in range(BINDING_LANES))
"""The loopback address of each lane; the resolver listens on all of them, and its serving certificate names them."""


def lane_host(hook: Mapping[str, Any]) -> str:
    """The loopback address the local plane gives a webhook entry: its lane's (objectSelector matchLabels
    hoss.io/lane), or the first lane's."""
    labels = (hook.get("objectSelector") or {}).get("matchLabels") or {}
    lane = labels.get(LANE_LABEL)
    return LANE_HOSTS[int(lane)] if isinstance(lane, str) and lane.isdigit() and int(lane) < len(LANE_HOSTS) \
        else LANE_HOSTS[0]


def webhook_configuration(manifest: Path, *, resolver_port: int, ca_cert: Path) -> dict[str, object]:
    """``manifest`` with each entry's service replaced by the resolver's URL at its lane's address, trusting
    ``ca_cert`` (the plane's CA, which signed the resolver's serving certificate)."""
    config: dict[str, Any] = yaml.safe_load(manifest.read_text())
    ca_bundle = base64.b64encode(ca_cert.read_bytes()).decode()
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://{lane_host(hook)}:{resolver_port}{path}", "caBundle": ca_bundle}
    return config

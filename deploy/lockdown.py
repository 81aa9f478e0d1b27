"""``hoss lockdown``: the credentials that lock a hoss deployment down, and the Redis ACL rules shared with the plane.

Two things a cluster needs beyond the resolver's serving certificate (``hoss certs``):

- **The apiserver's webhook client certificate.** The resolver answers reviews only from a client whose certificate
  its ``--client-ca-file`` signed. The apiserver presents one when its admission configuration
  (``--admission-control-config-file``) points the ValidatingAdmissionWebhook plugin at a kubeconfig holding it.
  This writes a CA of its own for that purpose, the client certificate (common name ``kube-apiserver``), the
  kubeconfig and the AdmissionConfiguration for the control-plane nodes, and the ConfigMap
  ``hoss-webhook-client-ca`` (the CA certificate alone) that the resolver mounts. The CA's key is not kept: nothing
  else can be issued that the resolver would trust.
- **Redis ACL users.** One user per hoss component with only the commands and keys it needs (`REDIS_ACL`), random
  passwords, the Secret ``hoss-redis-users`` (the ACL file the bundled Redis loads) and the Secret
  ``hoss-redis-urls`` (one ``redis://<user>:<password>@...`` URL per component, each Deployment's HOSS_REDIS_URL).

Files holding a key or a password are written with mode 0600 from the first byte (`deploy.pki.write_private`).
"""

from __future__ import annotations

import base64
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from deploy import pki

COMPONENTS = ("hoss-dispatcher", "hoss-worker", "hoss-resolver", "hoss-rescheduler")
WEBHOOK_CLIENT_NAME = "kube-apiserver"
"""Common name of the apiserver's webhook client certificate; the resolver's --client-names."""
WEBHOOK_CLIENT_CA_CONFIGMAP = "hoss-webhook-client-ca"
REDIS_USERS_SECRET = "hoss-redis-users"
REDIS_URLS_SECRET = "hoss-redis-urls"
DEFAULT_REDIS_HOST = "hoss-redis.hoss-system.svc"
DEFAULT_CONTROL_PLANE_DIR = "/etc/kubernetes/hoss"

_LEDGER_SCRIPT_COMMANDS = (
    "del exists get set hdel hget hgetall hincrby hlen hset incr pexpire pttl sadd scard sismember smembers smove srem"
    " time"
    " xadd xrevrange zadd zrem zrange zrangebyscore zremrangebyscore zscore"
)
"""What the ledger's Lua scripts (hoss/ledger/lua) call; Redis checks a script's commands against its caller's ACL
(tests/unit/test_redis_acl.py checks that this lists every command the scripts call)."""
_CONNECTION_COMMANDS = "+ping +hello +client|setname +select +evalsha +evalsha_ro +script|load +multi +exec +discard"
"""Every component's connection set-up and script calls (redis-py also sends CLIENT SETINFO, on Redis >= 7.2)."""
_LEDGER_KEYS = ("ready", "epoch", "nodes", "node:*", "pod:*", "assumed", "changes", "ipa:*", "nominated", "stats",
                "verify", "resized", "quotas", "quota:*", "nsused", "resv:*", "grown:*", "rwop:*", "attach:*",
                "disk:*", "device:*", "counters:*")
"""The ledger's keys under {hoss}: (tests/unit/test_redis_acl.py checks that the Lua scripts use no other)."""
_NODE_ENTRY_PARTS = ("used", "assumed", "admitted", "bound", "ports", "nominated")
"""The parts of a node's keys that its entries change (``{hoss}:node:<name>:<part>``); the rest (alloc, labels, spec)
describe the node and only the sync writes them."""
_WORKER_LEDGER_KEYS = (*(f"node:*:{part}" for part in _NODE_ENTRY_PARTS), "pod:*", "assumed", "changes", "ipa:*",
                       "nominated", "verify", "quota:sum:used", "nsused", "resv:*", "rwop:*", "attach:*",
                       "disk:*", "device:*", "counters:*")
"""What the workers' scripts (reserve, reserve_batch, release, release_owner, nominate, unnominate, promise_claims,
unpromise_claims, promise_attach, unpromise_attach, promise_disks, unpromise_disks, promise_counters,
unpromise_counters) may write: the ledger's entries and what follows them, the promises of ReadWriteOncePod claims,
of DRA devices and their shared counters, of nodes' CSI attach slots and of in-tree disks; never the ready flag,
the epoch, the node set, the stats counters, the quotas' definitions or a node's allocatable, labels or
description."""
_RESCHEDULER_LEDGER_KEYS = ("nominated", "node:*:nominated", "changes")
"""What the rescheduler's scripts (hold_moves, unnominate) may write: its holds, their per-node sets and their
announcements on the change stream."""
_QUEUE_KEYS = ("queue:*", "worker:*", "workers", "binding", "dispatched", "podver")


def _writes(keys: Sequence[str]) -> list[str]:
    return [f"%RW~{{hoss}}:{key}" for key in keys]


REDIS_ACL: dict[str, str] = {
    # Work streams, worker registry, dispatched map and podver; reads the ledger (the snapshot script, run with
    # EVALSHA_RO so its declared key {hoss}:ready counts as read) and resolver stats. `nominated`: a preemptor that
    # left the pending set gives up its held room (the mark-gone script). `term:*`: its leaders' terms (hoss.queue).
    "hoss-dispatcher": " ".join([
        "resetkeys %R~{hoss}:*", *_writes((*_QUEUE_KEYS, "nominated", "term:*")), "resetchannels -@all",
        _CONNECTION_COMMANDS,
        "+xadd +xrange +xlen +xreadgroup +xinfo|groups +xgroup|create +xack +xdel +hset +hget +hdel +hgetall +hmget",
        "+sadd +srem +smembers +scard +sismember +del +exists +get +set +pexpire +scan +time +xrevrange +zrem",
    ]),
    # Its queue and heartbeat, the dispatched map (acknowledgements) and the ledger (reservations, change stream).
    "hoss-worker": " ".join([
        "resetkeys %R~{hoss}:*", *_writes((*_WORKER_LEDGER_KEYS, *_QUEUE_KEYS)), "resetchannels -@all",
        _CONNECTION_COMMANDS, *(f"+{c}" for c in _LEDGER_SCRIPT_COMMANDS.split()),
        "+xread +xrange +xreadgroup +xinfo|groups +xgroup|create +xack +xdel +hmget +pexpire +zremrangebyscore +zcard",
    ]),
    # The ledger (sync, webhook), the sync's stamp, its write fences' counters (hoss/ledger/fence.py) and its own
    # stats hash; reads the rest, writes no work stream.
    "hoss-resolver": " ".join([
        "resetkeys %R~{hoss}:*", *_writes((*_LEDGER_KEYS, "stamp", "fence:*", "resolver:*")), "resetchannels -@all",
        _CONNECTION_COMMANDS, *(f"+{c}" for c in _LEDGER_SCRIPT_COMMANDS.split()),
        "+xread +xrange +hmget +expire +incr +incrby",
    ]),
    # The rescheduler reads the ledger, holds and drops rooms ({hoss}:nominated, the per-node sets, the change
    # stream's 'h' entries) through the ledger's scripts, and publishes its status for the dispatcher; it cannot
    # change a node's totals, an entry or the ready flag.
    "hoss-rescheduler": " ".join([
        "resetkeys %R~{hoss}:*", *_writes((*_RESCHEDULER_LEDGER_KEYS, "resched:*")),
        "resetchannels -@all", _CONNECTION_COMMANDS, *(f"+{c}" for c in _LEDGER_SCRIPT_COMMANDS.split()),
        "+hmget",
    ]),
}
"""Each hoss component's Redis ACL rules (after ``on`` and its password). Only the resolver may write the whole ledger
(its ready flag, nodes and counters); the workers write its entries, the rescheduler its holds, and the dispatcher
reads it. A user with EVALSHA may run any script, but Redis checks every command a script runs, and every key it
touches, against the caller's ACL: the keys are the boundary. The ledger's writing scripts declare
``{hoss}:changes`` (which every ledger writer may write), not the ready flag (`hoss.ledger.scripts`). Every key is
under the hash tag ``{hoss}``; no component may run a dangerous command (FLUSHALL, CONFIG, KEYS, ...)."""


def redis_acl(passwords: Mapping[str, str], *, client_setinfo: bool = False, admin: bool = False,
              probe: bool = False) -> str:
    """The ACL file: the default user disabled and without any password (so protected mode never applies and
    nobody can log in as it), each component of ``passwords`` with `REDIS_ACL`; with ``admin`` an ``admin`` user
    with every right (passwords["admin"]); with ``probe`` a user ``probe`` that may only PING (readiness probes).
    ``client_setinfo``: Redis >= 7.2 knows CLIENT SETINFO, which redis-py sends on connecting."""
    lines = ["user default off resetpass resetkeys resetchannels -@all"]
    if admin:
        lines.append(f"user admin on >{passwords['admin']} ~* &* +@all")
    if probe:
        lines.append("user probe on nopass resetkeys resetchannels -@all +ping")
    setinfo = " +client|setinfo" if client_setinfo else ""
    for component, rules in REDIS_ACL.items():
        if component in passwords:
            lines.append(f"user {component} on >{passwords[component]} {rules}{setinfo}")
    return "\n".join(lines) + "\n"


def new_passwords(users: Sequence[str] = COMPONENTS) -> dict[str, str]:
    return {user: secrets.token_urlsafe(24) for user in users}


def _secret(name: str, namespace: str, data: Mapping[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "hoss", "app.kubernetes.io/managed-by": "hoss-lockdown"}},
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def write(
    directory: Path, *, namespace: str = "hoss-system", redis_host: str = DEFAULT_REDIS_HOST,
    control_plane_dir: str = DEFAULT_CONTROL_PLANE_DIR, resolver_service: str = "hoss-resolver",
) -> list[Path]:
    """Write everything into ``directory``: ``control-plane/`` (for every apiserver node, under
    ``control_plane_dir``) and ``manifests.yaml`` (kubectl apply -f). Returns the files written."""
    plane = directory / "control-plane"
    plane.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hoss-lockdown-") as scratch:
        ca = pki.ensure_ca(Path(scratch), common_name="hoss-webhook-client-ca")
        client = pki.issue(ca, directory=Path(scratch), name="client", common_name=WEBHOOK_CLIENT_NAME, reuse=False)
        ca_pem = ca.cert.read_text()
        (plane / "webhook-client.crt").write_bytes(client.cert.read_bytes())
        pki.write_private(plane / "webhook-client.key", client.key.read_bytes())
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config",
        # Matched against the webhook's Service name (<service>.<namespace>.svc): only the resolver gets it.
        "users": [{"name": f"{resolver_service}.{namespace}.svc", "user": {
            "client-certificate": f"{control_plane_dir}/webhook-client.crt",
            "client-key": f"{control_plane_dir}/webhook-client.key",
        }}],
    }
    (plane / "webhook-kubeconfig.yaml").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    admission = {
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        # Both webhook plugins: the resolver's validating webhook and its router (a mutating webhook).
        "plugins": [{"name": plugin, "configuration": {
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": f"{control_plane_dir}/webhook-kubeconfig.yaml",
        }} for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")],
    }
    (plane / "admission-configuration.yaml").write_text(yaml.safe_dump(admission, sort_keys=False))

    passwords = new_passwords()
    urls = {c: f"redis://{c}:{passwords[c]}@{redis_host}:6379/0" for c in COMPONENTS}
    manifests: list[dict[str, object]] = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": WEBHOOK_CLIENT_CA_CONFIGMAP, "namespace": namespace,
                      "labels": {"app.kubernetes.io/part-of": "hoss"}},
         "data": {"ca.crt": ca_pem}},
        _secret(REDIS_USERS_SECRET, namespace, {"users.acl": redis_acl(passwords, probe=True)}),
        _secret(REDIS_URLS_SECRET, namespace, urls),
    ]
    out = directory / "manifests.yaml"
    pki.write_private(out, yaml.safe_dump_all(manifests, sort_keys=False).encode())
    return [plane / "webhook-client.crt", plane / "webhook-client.key", plane / "webhook-kubeconfig.yaml",
            plane / "admission-configuration.yaml", out]


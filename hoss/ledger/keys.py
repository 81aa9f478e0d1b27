"""Where the ledger lives in Redis: its key layout and the names of the keys other code reads or writes.

Only the Lua scripts (``hoss/ledger/lua``) write the ledger's keys; the names here are for reads (status pages, the
dispatcher, the rescheduler) and for the few writes outside the ledger that the layout allows (the dispatcher's
``podver`` and ``nominated`` entries, the rescheduler's status).

Key layout (one hash tag, so every script's keys are in one slot and it runs on Redis Cluster too)::

    {hoss}:ready                   "1" once rebuilt; missing means not ready
    {hoss}:epoch                   random id of the last rebuild
    {hoss}:nodes                   set of node names
    {hoss}:node:<name>:alloc       hash resource -> allocatable (base units)
    {hoss}:node:<name>:used        hash resource -> sum of the requests of its entries (zero fields removed)
    {hoss}:node:<name>:labels      hash label -> value
    {hoss}:node:<name>:assumed     set of uids with an assumed entry on the node
    {hoss}:node:<name>:admitted    set of uids with an admitted entry on the node
    {hoss}:node:<name>:bound       set of uids with a bound entry on the node
    {hoss}:pod:<uid>               hash node, pod, state (assumed|admitted|bound), owner, deadline (ms, assumed
                                   only), admitted (ms), via (binding|create|resize) and answered (admitted only),
                                   r:<resource> -> request (base units), ports (host ports, if any), meta
                                   (`hoss.model.compact.pod_meta`: namespace, labels, host ports; for workers)
    {hoss}:node:<name>:ports       hash '<protocol>/<port>' and '<protocol>/<ip>/<port>' -> how many entries on
                                   the node hold that host port; reserve and reserve_batch refuse a conflict
    {hoss}:assumed                 zset uid by deadline (ms)
    {hoss}:verify                  zset uid of admitted entries by when the sync looks at them again (ms)
    {hoss}:resized                 zset uid of entries a resize grew from a review nobody authenticated, by when
                                   the sync sets them back to their pod's request unless the apiserver shows it (ms)
    {hoss}:grown:<uid>             the largest request a resize allowed the pod while it had no node
                                   ('cpu=4000,pods=1'), expiring: a binding judged from an older view of the pod
                                   counts it (see 'Growth' in common.lua)
    {hoss}:stats                   hash overcommits (bound entries the apiserver put on a node without room),
                                   audit_drift (entries the audit repaired), stale_ledger (stale copies of
                                   the ledger detected), each with last_<counter>
    {hoss}:stamp                   counter the syncing replica increments on every watchdog tick (see tick)
    {hoss}:fence:<id>              a fenced ledger client's write fence: every script it runs increments it
                                   (hoss/ledger/fence.py); expires a day after its last check
    {hoss}:node:<name>:spec        the node's compact description (JSON, `hoss.model.compact.compact_node`)
    {hoss}:changes                 stream of changes (used totals, pods placed and removed, node descriptions,
                                   removals, rebuilds) that workers follow instead of re-reading nodes; see
                                   common.lua for the entries
    {hoss}:podver                  hash uid -> digest or "gone": the dispatcher's word that a queued pod changed
                                   or left; a reservation of another version answers "stale"
    {hoss}:nominated               hash uid -> JSON (node, priority, deadline, request): room held for a preempting
                                   pod; new entries of lower priority must fit beside it (common.lua, Nominations)
    {hoss}:node:<name>:nominated   set of the uids nominated to the node
    {hoss}:quotas                  set of the namespaces with an elastic quota (scheduler-plugins' ElasticQuota)
    {hoss}:quota:ns:<ns>           hash min:<resource> / max:<resource> -> amount (base units)
    {hoss}:nsused                  hash '<ns>/<resource>' -> sum of the requests of the namespace's entries
    {hoss}:quota:sum:used, :sum:min  hash resource -> sum over the quota namespaces of used, of min
                                   (see 'Elastic quotas' in common.lua: the rule every entry-creating script checks)
"""

from __future__ import annotations

from typing import Final

KEY_PREFIX: Final = "{hoss}"
READY_KEY: Final = f"{KEY_PREFIX}:ready"
EPOCH_KEY: Final = f"{KEY_PREFIX}:epoch"
NOMINATED_KEY: Final = f"{KEY_PREFIX}:nominated"
"""Room held for preempting pods (see 'Nominations' in hoss/ledger/lua/common.lua); the dispatcher ends the
nomination of a pod that left the pending set."""
STATS_KEY: Final = f"{KEY_PREFIX}:stats"
STAMP_KEY: Final = f"{KEY_PREFIX}:stamp"
CHANGES_KEY: Final = f"{KEY_PREFIX}:changes"
RESCHED_STATUS_KEY: Final = f"{KEY_PREFIX}:resched:status"
"""The rescheduler leader's last plans and outcomes (JSON), which the dispatcher's /status shows."""
PODVER_KEY: Final = f"{KEY_PREFIX}:podver"

RESERVATION_PREFIX: Final = "Reservation/"
"""The `pod` of a Reservation's entry is 'Reservation/<name>' (no pod key has an upper-case namespace)."""


def reservation_key(name: str) -> str:
    """The ledger's name for the entry of the Reservation `name`."""
    return f"{RESERVATION_PREFIX}{name}"

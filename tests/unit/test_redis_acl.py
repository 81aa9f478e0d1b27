"""The Redis ACL rules of deploy/lockdown.py keep up with the code: every command and key the ledger's Lua scripts
use is granted to the components that run them (Redis checks a script's commands against its caller's ACL), so a
new script command fails here, not as a NOPERM in a running cluster."""

from __future__ import annotations

import re
from pathlib import Path

from deploy import lockdown

LUA = Path(__file__).resolve().parents[2] / "hoss" / "ledger" / "lua"


def lua_commands() -> set[str]:
    found: set[str] = set()
    for script in LUA.glob("*.lua"):
        found |= {c.lower() for c in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", script.read_text())}
    return found


def lua_keys() -> set[str]:
    found: set[str] = set()
    for script in LUA.glob("*.lua"):
        found |= set(re.findall(r"PREFIX \.\. '(:[\w:]+)", script.read_text()))
    return found


def test_the_scripts_call_commands_only_by_name() -> None:
    for script in LUA.glob("*.lua"):
        for call in re.findall(r"redis\.p?call\(\s*([^'\"\s][^,)]*)", script.read_text()):
            raise AssertionError(f"{script.name} calls redis with a computed command {call!r}: list it in the ACL")


def test_every_script_command_is_granted_to_the_ledger_writers() -> None:
    commands = lua_commands()
    assert {"hset", "xadd", "evalsha"} - {"evalsha"} <= commands, "the scan found the scripts' commands"
    for component in ("hoss-worker", "hoss-resolver"):
        granted = set(re.findall(r"\+([\w|]+)", lockdown.REDIS_ACL[component]))
        assert commands <= granted, f"{component} lacks {sorted(commands - granted)}"


SYNC_ONLY_KEYS = {":ready", ":epoch", ":nodes", ":stats", ":quotas", ":quota:ns:", ":quota:sum:min"}
"""Keys only the resolver's sync writes (rebuild, sync_node, remove_node, set_quotas, the overcommit count)."""


def written_patterns(component: str) -> list[str]:
    return [p.replace("*", "") for p in re.findall(r"%RW~\{hoss\}(\S+)", lockdown.REDIS_ACL[component])]


def test_every_script_key_is_writable_by_the_ledger_writers() -> None:
    keys = lua_keys()
    assert {":nodes", ":node:", ":pod:"} <= keys, "the scan found the scripts' keys"
    # The resolver runs every script but reserve_batch and reserve, whose only other key, podver, they only read.
    # The workers write the entries and what follows them, not what only the sync writes, nor what only the
    # webhook's resize writes (grown, resized); a node's keys they write are its entry parts
    # (test_a_worker_writes_the_node_keys_its_entries_change).
    read_only = {"hoss-worker": SYNC_ONLY_KEYS | {":node:", ":grown:", ":resized"}, "hoss-resolver": {":podver"}}
    for component, exempt in read_only.items():
        patterns = written_patterns(component)
        for key in keys - exempt:
            assert any(key == p or (p.endswith(":") and key.startswith(p)) for p in patterns), (
                f"{component} may not write {{hoss}}{key}"
            )


def test_a_worker_writes_the_node_keys_its_entries_change_and_nothing_only_the_sync_writes() -> None:
    patterns = written_patterns("hoss-worker")
    assert {":node::used", ":node::assumed", ":node::ports", ":node::nominated"} <= set(patterns)
    assert not [p for p in patterns if p in SYNC_ONLY_KEYS or p in (":node:", ":node::alloc", ":node::labels")]


def test_the_rescheduler_writes_only_its_holds_and_its_status() -> None:
    assert sorted(written_patterns("hoss-rescheduler")) == [":changes", ":node::nominated", ":nominated",
                                                            ":resched:"]


def test_the_acl_file_disables_the_default_user_and_gives_each_component_its_rules() -> None:
    text = lockdown.redis_acl({"hoss-worker": "pw-w", "hoss-resolver": "pw-r", "hoss-dispatcher": "pw-d"})
    lines = text.splitlines()
    assert lines[0] == "user default off resetpass resetkeys resetchannels -@all"
    assert any(line.startswith("user hoss-worker on >pw-w resetkeys %R~{hoss}:*") for line in lines)
    assert "admin" not in text and "probe" not in text
    assert "-@all" in lockdown.REDIS_ACL["hoss-dispatcher"]

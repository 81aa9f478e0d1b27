"""Running the ledger's Lua scripts: their sources, EVALSHA (EVALSHA_RO for those that only read), and the reply.

Every ledger operation is one script, ``hoss/ledger/lua/<operation>.lua`` with ``common.lua`` prepended, so it is
atomic. Each call declares one key, which routes it to the hash tag's slot on a Redis Cluster, and passes the key
prefix as its first argument; the script refuses to write while the ledger is not ready (see `hoss.ledger.client`).
The declared key is ``{hoss}:ready`` for the scripts that only read (EVALSHA_RO counts it as read) and
``{hoss}:changes`` for those that write: plain EVALSHA counts a declared key as written, and every ledger writer
may write the change stream, while only the resolver may write the ready flag (deploy/lockdown.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
from collections.abc import Sequence
from typing import Any, Final

from redis.exceptions import NoScriptError, ResponseError

from hoss.errors import LedgerUnavailable
from hoss.ledger.connection import LedgerScript, ScriptClient, redis_call
from hoss.ledger.fence import LOST_WRITES, WriteFence
from hoss.ledger.keys import CHANGES_KEY, KEY_PREFIX, READY_KEY

logger = logging.getLogger(__name__)

READ_ONLY_SCRIPTS: Final = frozenset({"snapshot", "entries", "load", "nominations", "quotas", "quota_audit",
                                      "reservation_owners", "used_audit"})
"""The scripts that only read; they run with EVALSHA_RO."""


@functools.cache
def script_source(name: str) -> str:
    """The source of the script `name`: common.lua, then its own file."""
    scripts = importlib.resources.files("hoss.ledger") / "lua"
    return (scripts / "common.lua").read_text() + "\n" + (scripts / f"{name}.lua").read_text()


class ReadOnlyScript:
    """A script run with EVALSHA_RO (Redis 7.0): Redis refuses any write it attempts and counts the keys it declares
    ({hoss}:ready) as read, so a user that may only read the ledger (the dispatcher's) can run it. Plain EVALSHA
    counts declared keys as written, whatever the script does.

    A server that does not know EVALSHA_RO (Redis before 7.0, or fakeredis in unit tests) gets plain EVALSHA; the
    ACL still decides there (a read-only user is refused with NOPERM), so nothing is opened by it."""

    def __init__(self, client: ScriptClient, source: str) -> None:
        self._client = client
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()  # Redis names scripts by their SHA-1
        self._plain: LedgerScript | None = None

    async def __call__(self, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        if self._plain is not None:
            return await self._plain(keys=keys, args=args)
        try:
            return await self._client.evalsha_ro(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._client.script_load(self._source)
            return await self._client.evalsha_ro(self._sha, len(keys), *keys, *args)
        except ResponseError as error:
            if not str(error).lower().startswith("unknown command"):
                raise
            logger.warning("Redis has no EVALSHA_RO (before 7.0): read-only ledger scripts run with EVALSHA")
            self._plain = self._client.register_script(self._source)
            return await self._plain(keys=keys, args=args)


class ScriptRunner:
    """Runs the ledger's scripts by name on one client, each registered at its first call."""

    def __init__(self, client: ScriptClient, *, fence: WriteFence | None = None) -> None:
        """``fence``: every script that may write carries it (its counter, declared second, and the count of calls
        answered, the first argument after the prefix; see `hoss.ledger.fence`)."""
        self._client = client
        self._scripts: dict[str, LedgerScript] = {}
        self._fence = fence

    async def run(self, name: str, args: Sequence[str | int]) -> list[Any]:
        """The flat reply of script `name` called with `args`; a Redis failure raises LedgerUnavailable."""
        script = self._scripts.get(name)
        if script is None:
            source = script_source(name)
            script = self._scripts[name] = (
                ReadOnlyScript(self._client, source) if name in READ_ONLY_SCRIPTS
                else self._client.register_script(source)
            )
        declared = READY_KEY if name in READ_ONLY_SCRIPTS else CHANGES_KEY
        fence = None if name in READ_ONLY_SCRIPTS else self._fence
        if fence is None:
            reply = await redis_call(script(keys=[declared], args=[KEY_PREFIX, *args]))
        else:
            reply = await self._fenced(name, script, declared, fence, args)
        if not isinstance(reply, list):
            raise LedgerUnavailable(f"ledger script {name} replied {reply!r}, expected a list")
        return reply

    @staticmethod
    async def _fenced(name: str, script: LedgerScript, declared: str, fence: WriteFence,
                      args: Sequence[str | int]) -> Any:
        """Run a script under the fence. When it finds writes lost (it wrote nothing, and marked the ledger not
        ready), the fence starts over on a fresh counter and the call runs once more: refused as not ready, or
        run anyway (a rebuild)."""
        for _ in range(2):
            key = fence.key
            reply = await redis_call(script(keys=[declared, key], args=[KEY_PREFIX, fence.answered, *args]))
            fence.answer(key)
            if not (isinstance(reply, list) and reply and _text(reply[0]) == LOST_WRITES):
                return reply
            if key == fence.key:
                logger.warning("Redis lost the writes of at least %s ledger calls this process made (it came back "
                               "from an older copy): the ledger is not ready until the sync rebuilds it (%s)",
                               _text(reply[1]), name)
                fence.renew()
        raise LedgerUnavailable(f"ledger script {name}: writes lost again under a fresh fence")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

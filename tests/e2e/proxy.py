"""A TCP proxy for end-to-end tests that holds one direction of its connections on demand: a component behind it
keeps its connections and loses nothing sent on them, only gets it late. Holding the replies makes a watch lag (the
resolver's sync, test_oversell_holes); holding the requests makes a write arrive late, after the writer lost its
standing (a paused dispatcher leader, test_guarantee_access)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class Link:
    """One proxied connection: its gate (set: what it holds flows), what it held while frozen, and whether the
    other direction carried anything after the last thaw."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    held: bytearray = field(default_factory=bytearray)
    answered: asyncio.Event = field(default_factory=asyncio.Event)


class FreezableProxy:
    """A TCP proxy to 127.0.0.1:``target_port``. `freeze` holds what its connections open so far carry in the
    ``hold`` direction (the target's ``replies``, or the client's ``requests``) until `thaw`; connections opened later
    pass freely."""

    def __init__(self, target_port: int, *, hold: Literal["replies", "requests"] = "replies") -> None:
        self.target_port = target_port
        self.hold = hold
        self.links: list[Link] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _connection(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        link = Link()
        link.gate.set()
        self.links.append(link)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.close()
            return

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, held: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if held and not link.gate.is_set():
                        link.held += data
                        await link.gate.wait()
                    elif not held:
                        link.answered.set()
                    writer.write(data)
                    await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        requests_held = self.hold == "requests"
        await asyncio.gather(pipe(client_reader, upstream_writer, held=requests_held),
                             pipe(upstream_reader, client_writer, held=not requests_held))

    def freeze(self) -> None:
        for link in self.links:
            link.gate.clear()

    def thaw(self) -> None:
        for link in self.links:
            link.answered.clear()
            link.gate.set()

    def holding(self, needle: bytes) -> Link | None:
        """The connection whose held bytes contain ``needle``, if any."""
        return next((link for link in self.links if needle in link.held), None)

    async def close(self) -> None:
        self.thaw()
        if self.server is not None:
            self.server.close()

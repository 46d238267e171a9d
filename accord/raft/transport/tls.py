"""TLS on the peer links: the contexts the node hands in, and the handshake on each end.

The raft layer reads no configuration and no files. The node gives the transport a
``PeerTLS``: two callables returning the ``ssl.SSLContext`` for the next accepted and
the next dialed connection (behind them the node re-reads rotated certificate files,
so each new connection uses whatever certificate is current).

Accepting: ``TLSListener`` accepts sockets itself and runs each one's handshake with
the context current at that moment. A handshake that fails (no certificate, one not
signed by the trusted CA, a plaintext peer, a timeout) closes the connection before one
byte of it is read as a frame, and the transport logs who and why. asyncio's own TLS
listener (``start_server(ssl=...)``) would drop such a connection without a word (it
reports handshake errors only in debug mode) and could not change its context, which is
why the transport runs the handshake itself.

Dialing: ``open_connection(ssl=...)`` with the dialed host as the expected name: the
peer's certificate must be signed by the trusted CA and carry that host (an IP SAN for
an address) or the dial fails.

Only once both ends finished TLS does the transport's Hello exchange begin, and Raft
frames flow only after that: a refused peer never delivers a Raft message. Under TLS
1.3 a dialer completes its half before the acceptor has checked the dialer's
certificate; a refused dialer learns it when reading the Hello reply fails with the
acceptor's alert, and the acceptor has read nothing from it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from accord.raft.transport.framing import FrameError, within


@dataclass(frozen=True, slots=True)
class PeerTLS:
    """Where each new peer connection takes its TLS context from."""

    server_context: Callable[[], ssl.SSLContext]
    """For accepted connections; should require a client certificate (mutual TLS)."""
    client_context: Callable[[], ssl.SSLContext]
    """For dialed connections: presents this node's certificate, verifies the peer's."""
    handshake_timeout: float = 5.0


class TLSRefused(FrameError):
    """A TLS handshake failed or the peer refused this node's certificate."""


def describe(exc: BaseException) -> str:
    """A TLS failure in one line (OpenSSL's reason, or what went wrong instead)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"{exc.reason or exc}".lower().replace("_", " ")
    if isinstance(exc, asyncio.IncompleteReadError | EOFError | ConnectionError):
        return "the peer closed the connection"
    return str(exc) or type(exc).__name__


def peer_name(writer: asyncio.StreamWriter) -> str:
    """The common name of the peer's verified certificate, or "-" if it showed none."""
    obj = writer.get_extra_info("ssl_object")
    cert = obj.getpeercert() if obj is not None else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return "-"


class TLSListener:
    """Accepts peer connections and completes TLS on each before handing it on.

    Quacks like the ``asyncio.Server`` the plaintext transport listens with
    (``sockets``, ``close``, ``wait_closed``). Every accepted socket gets a task that
    runs the handshake with the context current at that moment
    (``loop.connect_accepted_socket``, which reports a failed handshake to its caller
    on asyncio's loop and uvloop alike, where upgrading a stream with ``start_tls``
    hangs on uvloop); a connection that passes goes to ``on_connection`` as a stream
    pair, one that fails goes to ``on_refused`` with the reason and is closed.
    """

    def __init__(self, host: str, port: int, tls: PeerTLS,
                 on_connection: Callable[[asyncio.StreamReader, asyncio.StreamWriter], None],
                 on_refused: Callable[[object, str], None]) -> None:
        self._tls = tls
        self._on_connection = on_connection
        self._on_refused = on_refused
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family)
        self._sock.setblocking(False)
        self.sockets = [self._sock]
        self._tasks: set[asyncio.Task[None]] = set()
        self._spawn(self._accept_loop(), "raft-tls-accept")

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of descriptors, say: wait, then go on accepting
                self._on_refused(None, f"accept failed: {exc}")
                await asyncio.sleep(0.1)
                continue
            self._spawn(self._handshake(conn, addr), "raft-tls-handshake")

    async def _handshake(self, conn: socket.socket, addr: object) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        timeout = self._tls.handshake_timeout
        try:
            transport, _ = await within(loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self._tls.server_context(),
                ssl_handshake_timeout=timeout), timeout + 1.0)
        except (OSError, TimeoutError, EOFError) as exc:
            conn.close()
            self._on_refused(addr, f"TLS handshake failed: {describe(exc)}")
            return
        except BaseException:
            conn.close()
            raise
        self._on_connection(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

    def close(self) -> None:
        """Stop accepting and abandon handshakes in progress."""
        for task in self._tasks:
            task.cancel()  # before the socket goes: a pending accept is withdrawn, not failed
        self._sock.close()

    async def wait_closed(self) -> None:
        """Wait for the accept loop and every handshake task to end."""
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def dial(host: str, port: int, tls: PeerTLS,
               connect_timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect and complete TLS, verifying that the peer's certificate names ``host``.

    Raises ``TLSRefused`` for a failed handshake, ``OSError``/``TimeoutError`` when the
    peer cannot be reached."""
    try:
        return await within(
            asyncio.open_connection(host, port, ssl=tls.client_context(), server_hostname=host,
                                    ssl_handshake_timeout=tls.handshake_timeout),
            connect_timeout + tls.handshake_timeout)
    except ssl.SSLError as exc:
        raise TLSRefused(f"TLS handshake failed: {describe(exc)}") from exc

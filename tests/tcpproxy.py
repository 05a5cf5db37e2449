"""A TCP proxy for tests that can stop relaying, like a network path that silently drops
everything: no RST, no FIN, the sockets stay open and whatever is sent just sits there.

    with TcpProxy("127.0.0.1", 5432) as proxy:
        dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/db"
        ...
        proxy.freeze()   # bytes stop flowing both ways, connections stay open
        proxy.thaw()     # what was sent meanwhile goes through

While frozen, new connections are still accepted (the SYN got through) but nothing is
relayed on them either. ``thaw(existing=False)`` lets new connections through while every
connection that was open at the freeze stays stalled for good: a path that healed for new
connections, with the old ones lost in it. ``cut()`` resets every open connection;
``latency`` adds that many seconds to every round trip. ``close()`` stops the proxy and
closes every socket it holds.

The proxy's own kernel still acknowledges what a client sends (and answers its TCP
keepalive probes): to the client it looks like a peer that stopped answering at the
application level, such as a stalled server or a middlebox cut off from the server.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen_host, 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._relaying = threading.Event()  # new connections get through
        self._relaying.set()
        self._links: list[threading.Event] = []  # one per relayed connection: relaying
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.connections = 0  # accepted so far
        # Round-trip time added to every exchange (half each way), like a slow network path.
        self.latency = 0.0
        self._start(self._accept_loop, "tcpproxy-accept")

    # -- control ----------------------------------------------------------------------------

    def freeze(self) -> None:
        """Stop relaying in both directions; every socket stays open."""
        with self._lock:
            self._relaying.clear()
            for link in self._links:
                link.clear()

    def thaw(self, *, existing: bool = True) -> None:
        """Relay again: on every connection, or (``existing=False``) on new ones only."""
        with self._lock:
            self._relaying.set()
            if existing:
                for link in self._links:
                    link.set()

    def cut(self) -> None:
        """Reset every connection open now (both ends see it drop); new ones get through."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            _close(sock)

    @property
    def frozen(self) -> bool:
        return not self._relaying.is_set()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._relaying.set()
            for link in self._links:
                link.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)
        for thread in self._threads:
            thread.join(2.0)

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- relaying ---------------------------------------------------------------------------

    def _start(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _keep(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed.is_set():
                _close(sock)
                return False
            self._sockets.append(sock)
            return True

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            self.connections += 1
            if not self._keep(client):
                return
            self._start(self._connect_and_pump, f"tcpproxy-{self.connections}", client)

    def _connect_and_pump(self, client: socket.socket) -> None:
        # A frozen path lets nothing through, not even the connection to the server.
        while not self._relaying.wait(0.1):
            if self._closed.is_set():
                return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        if not self._keep(upstream):
            return
        with self._lock:
            link = threading.Event()
            if self._relaying.is_set():
                link.set()
            self._links.append(link)
        self._pump(client, upstream, link)

    def _pump(self, client: socket.socket, upstream: socket.socket,
              link: threading.Event) -> None:
        peers = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                if not link.is_set():
                    link.wait(0.1)
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                if not link.is_set():
                    continue  # froze while waiting: what arrived waits for the thaw
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if self.latency:
                        time.sleep(self.latency / 2)
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            # cut() closed the sockets under this thread (select() then sees fd -1).
            return
        finally:
            _close(client)
            _close(upstream)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass

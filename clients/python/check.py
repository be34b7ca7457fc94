"""Drives the embedded proxy's Toxiproxy API with toxiproxy-python, as a Python user would.

Usage: check.py HOST:PORT (the API, e.g. served by `cargo run -p faultproxy --example
serve_api -- 127.0.0.1:8474`). Starts a TCP echo server of its own as the upstream, creates a
proxy to it, adds a latency toxic and checks that a real round trip takes at least that long,
removes it and checks the echo again. Exits non-zero on the first difference.
"""

import socket
import socketserver
import sys
import threading
import time

from toxiproxy import Toxiproxy
from toxiproxy.exceptions import NotFound, ProxyExists

LATENCY_MS = 300
PROXY = "python_echo"


def fail(message):
    print(f"clients/python: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(4096)
            if not data:
                return
            self.request.sendall(data)


def echo_round_trip(address):
    """Seconds for one line to go through `address` and back, on a new connection."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        started = time.monotonic()
        connection.sendall(b"ping\n")
        received = b""
        while len(received) < 5:
            chunk = connection.recv(5 - len(received))
            if not chunk:
                fail(f"{address} closed before echoing (got {received!r})")
            received += chunk
        took = time.monotonic() - started
    check(received == b"ping\n", f"echo through {address}: got {received!r}")
    return took


def main():
    if len(sys.argv) != 2:
        fail("usage: check.py HOST:PORT")
    api_host, api_port = sys.argv[1].rsplit(":", 1)

    upstream = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    upstream_address = "127.0.0.1:%d" % upstream.server_address[1]

    toxiproxy = Toxiproxy()
    toxiproxy.update_api_consumer(api_host, int(api_port))
    check(toxiproxy.running(), f"no API at {sys.argv[1]}")
    check(b'"version"' in toxiproxy.version(), "GET /version")

    proxy = toxiproxy.create(upstream=upstream_address, name=PROXY, listen="127.0.0.1:0")
    check(not proxy.listen.endswith(":0"), f"the real port is reported: {proxy.listen}")
    check(proxy.enabled is True, "a new proxy is enabled")
    check(PROXY in toxiproxy.proxies(), "the proxy is listed")
    try:
        toxiproxy.create(upstream=upstream_address, name=PROXY)
        fail("a second proxy of the same name was accepted")
    except ProxyExists:
        pass
    echo_round_trip(proxy.listen)

    proxy.add_toxic(type="latency", attributes={"latency": LATENCY_MS})
    toxic = proxy.get_toxic("latency_downstream")
    check(toxic is not None, f"the toxic is listed: {list(proxy.toxics())}")
    check(toxic.attributes.get("latency") == LATENCY_MS, f"attributes: {toxic.attributes}")
    check(toxic.stream == "downstream" and toxic.toxicity == 1.0, "toxic defaults")
    took = echo_round_trip(proxy.listen)
    check(took >= LATENCY_MS / 1000, f"a round trip took {took:.3f} s under {LATENCY_MS} ms")

    check(proxy.destroy_toxic("latency_downstream"), "removing the toxic")
    check(proxy.toxics() == {}, "no toxic left")
    echo_round_trip(proxy.listen)
    try:
        proxy.destroy_toxic("latency_downstream")
        fail("removing a removed toxic was accepted")
    except NotFound:
        pass

    with proxy.down():
        try:
            echo_round_trip(proxy.listen)
            fail("a disabled proxy still answered")
        except ConnectionRefusedError:
            pass
    echo_round_trip(proxy.listen)

    check(toxiproxy.destroy(proxy), "deleting the proxy")
    check(PROXY not in toxiproxy.proxies(), "the proxy is gone")
    upstream.shutdown()
    print("clients/python: toxiproxy-python drove the API: proxy, latency toxic, echo: ok")


if __name__ == "__main__":
    main()

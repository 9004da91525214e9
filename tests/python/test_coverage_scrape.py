"""`rayfabric status`'s read of Ray's own received bytes from a node's metrics endpoint
(metrics.ray_bytes_received): the metric summed over its series from a real HTTP endpoint; and
unknown (None), never an error, for an endpoint without the metric, one that answers garbage, one
that hangs, and a port nobody listens on."""
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import pytest  # noqa: E402

from rayfabric import metrics  # noqa: E402

PAGE = ('# TYPE ray_object_manager_bytes gauge\n'
        'ray_object_manager_bytes{Component="raylet",NodeAddress="127.0.0.1",Type="Received"} 67108864.0\n'
        'ray_object_manager_bytes{Component="raylet",NodeAddress="127.0.0.1",Type="PushedFromLocalPlasma"} 5.0\n'
        'ray_object_manager_bytes{Component="raylet",NodeAddress="127.0.0.2",Type="Received"} 1024.0\n')


def serve(body):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def raw(reply, hang_s=0.0):
    """A listener that answers every connection with `reply` bytes (after hang_s)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)

    def loop():
        while True:
            c, _ = s.accept()
            time.sleep(hang_s)
            try:
                c.sendall(reply)
            except OSError:
                pass
            c.close()

    threading.Thread(target=loop, daemon=True).start()
    return s


def node(port):
    return {"NodeManagerAddress": "127.0.0.1", "MetricsExportPort": port}


def test_the_received_series_summed():
    server = serve(PAGE)
    assert metrics.ray_bytes_received(node(server.server_port)) == 67108864 + 1024
    server.shutdown()


def test_no_metric_yet_is_unknown():
    server = serve("# nothing reported yet\n")
    assert metrics.ray_bytes_received(node(server.server_port)) is None
    server.shutdown()


@pytest.mark.parametrize("reply", [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"])
def test_a_broken_endpoint_is_unknown(reply):
    s = raw(reply)
    assert metrics.ray_bytes_received(node(s.getsockname()[1])) is None


def test_a_hanging_endpoint_is_unknown_within_the_timeout():
    s = raw(b"", hang_s=30)
    start = time.monotonic()
    assert metrics.ray_bytes_received(node(s.getsockname()[1]), timeout=0.5) is None
    assert time.monotonic() - start < 10


def test_no_listener_or_no_port_is_unknown():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert metrics.ray_bytes_received(node(port)) is None
    assert metrics.ray_bytes_received({"NodeManagerAddress": "127.0.0.1"}) is None

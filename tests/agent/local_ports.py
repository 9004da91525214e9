"""A free local port, for tests that start Ray with `ray start` or a dashboard of their own
(standard library only: tests of the installed package import nothing of this checkout)."""
import socket


def free_port():
    """A TCP port free on 127.0.0.1 now (a cluster's GCS or dashboard port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

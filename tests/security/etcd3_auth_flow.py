"""python-etcd3's user/password auth against a server set up by test_auth_clients.py.

Usage: PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python python etcd3_auth_flow.py HOST PORT
(run as a subprocess, as tests/compat/etcd3_roundtrip.py is). Prints ``ALL OK`` at the end.
"""

from __future__ import annotations

import sys

import etcd3
import grpc


def refused(fn: object, code: grpc.StatusCode) -> str:
    try:
        fn()  # type: ignore[operator]
    except grpc.RpcError as e:
        assert e.code() == code, (e.code(), e.details())
        return str(e.details())
    raise AssertionError("expected a refusal")


def client(host: str, port: int, **kw: object) -> etcd3.Etcd3Client:
    """etcd3.client(...), which authenticates, then sends its token as ``token`` metadata.

    python-etcd3 0.12 also attaches the token as gRPC *call credentials*, which grpcio
    (>=1.3x) refuses to send over a plaintext channel ("Established channel does not have
    a sufficient security level"), against real etcd as against accord; the metadata
    alone is how etcd reads the token, so the call credentials are dropped."""
    c = etcd3.client(host=host, port=port, timeout=10, **kw)
    c.call_credentials = None
    return c


def main(host: str, port: int) -> None:
    c = client(host, port, user="u", password="u-pw")
    c.put("/t/e3", "1")
    assert c.get("/t/e3")[0] == b"1"
    assert [v for v, _ in c.get_prefix("/t/")] == [b"1"]
    assert refused(lambda: c.put("/x", "1"), grpc.StatusCode.PERMISSION_DENIED) == (
        "etcdserver: permission denied")
    assert refused(lambda: c.get("/x"), grpc.StatusCode.PERMISSION_DENIED) == (
        "etcdserver: permission denied")
    ok, _ = c.transaction(compare=[c.transactions.version("/t/e3") > 0],
                          success=[c.transactions.put("/t/e3", "2")], failure=[])
    assert ok
    assert refused(lambda: c.transaction(compare=[], success=[c.transactions.get("/t/e3")],
                                         failure=[c.transactions.put("/x", "v")]),
                   grpc.StatusCode.PERMISSION_DENIED)
    c.delete("/t/e3")
    print("user ok", flush=True)

    try:
        client(host, port, user="u", password="wrong")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.code()
        assert e.details() == "etcdserver: authentication failed, invalid user ID or password"
    else:
        raise AssertionError("a wrong password was accepted")
    anon = client(host, port)
    assert refused(lambda: anon.get("/t/e3"), grpc.StatusCode.INVALID_ARGUMENT) == (
        "etcdserver: user name is empty")
    root = client(host, port, user="root", password="root-pw")
    root.put("/x", "r")
    assert root.get("/x")[0] == b"r"
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""python-etcd3 and aetcd authenticate against accord as against etcd: each client runs
in a child interpreter (their generated protos clash with accord's) against a real
accord node and a real etcd, both set up with the same users, roles and grants."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from accord.proto import auth_pb2, rpc_pb2, rpc_pb2_grpc
from tests.compat.servers import etcd_server
from tests.integration.cluster import ProcCluster

HERE = Path(__file__).resolve().parent
T = 10.0


def set_up(endpoint: str) -> None:
    """root (with the root role), role r: readwrite on the prefix /t/, user u with r."""
    with grpc.insecure_channel(endpoint) as ch:
        a = rpc_pb2_grpc.AuthStub(ch)
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="root-pw"), timeout=T)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), timeout=T)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=T)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="r"), timeout=T)
        a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
            name="r", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE,
                                               key=b"/t/", range_end=b"/t0")), timeout=T)
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password="u-pw"), timeout=T)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="u", role="r"), timeout=T)
        a.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=T)


@pytest.fixture(scope="module", params=["accord", "etcd"])
def endpoint(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp(f"auth-clients-{request.param}")
    if request.param == "etcd":
        with etcd_server(root) as etcd:
            set_up(etcd.endpoint)
            yield etcd.endpoint
        return
    cluster = ProcCluster(root, 1)
    cluster.start_all()
    try:
        cluster.leader()
        set_up(cluster.nodes[0].endpoint)
        yield cluster.nodes[0].endpoint
    finally:
        cluster.stop_all()


def _run(script: str, endpoint: str, env: dict[str, str]) -> None:
    host, port = endpoint.rsplit(":", 1)
    proc = subprocess.run([sys.executable, str(HERE / script), host, port], capture_output=True,
                          text=True, timeout=90, env={**os.environ, **env})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ALL OK"), (
        f"{script} against {endpoint} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")


def test_python_etcd3_user_password_auth(endpoint: str) -> None:
    _run("etcd3_auth_flow.py", endpoint, {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})


def test_aetcd_auth_flow(endpoint: str) -> None:
    _run("aetcd_auth_flow.py", endpoint, {})

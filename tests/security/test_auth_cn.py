"""CN-based authentication: with ``--client-cert-auth`` and no token, the verified client
certificate's common name is the user (etcd's ``AuthInfoFromTLS``); a token, when sent,
wins over the certificate. A real node under mutual TLS, certificates from
``accord/node/certs.py``."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from accord.client.tls import TLSOptions, sync_channel
from accord.proto import auth_pb2, rpc_pb2, rpc_pb2_grpc
from tests.integration.cluster import ClusterTLS, ProcCluster, ProcNode

T = 10.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProcNode, ClusterTLS]]:
    root = tmp_path_factory.mktemp("auth-cn")
    tls = ClusterTLS.make(root / "pki", ["n1"])
    c = ProcCluster(root, 1, tls=tls)
    c.start_all()
    try:
        c.leader()
        yield c.nodes[0], tls
    finally:
        c.stop_all()


def channel_as(node: ProcNode, tls: ClusterTLS, cn: str) -> grpc.Channel:
    files = tls.ca.issue(cn, server=False).write(tls.folder, f"user-{cn}", tls.ca)
    return sync_channel(node.client_url, TLSOptions(cacert=str(files.ca), cert=str(files.cert),
                                                    key=str(files.key)))


def test_the_certificate_common_name_is_the_user(node: tuple[ProcNode, ClusterTLS]) -> None:
    n1, tls = node
    a = rpc_pb2_grpc.AuthStub(n1.channel())  # the helpers' certificate: CN "client"
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="cn-root-pw"), timeout=T)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=T)
    a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="t"), timeout=T)
    a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="t", perm=auth_pb2.Permission(
        permType=auth_pb2.Permission.READWRITE, key=b"/t/", range_end=b"/t0")), timeout=T)
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="client", options=auth_pb2.UserAddOptions(
        no_password=True)), timeout=T)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="client", role="t"), timeout=T)
    a.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=T)

    kv = n1.kv()  # no token: the certificate says "client"
    kv.Put(rpc_pb2.PutRequest(key=b"/t/a", value=b"1"), timeout=T)
    with pytest.raises(grpc.RpcError) as e:
        kv.Put(rpc_pb2.PutRequest(key=b"/x", value=b"1"), timeout=T)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.PERMISSION_DENIED,
                                                   "etcdserver: permission denied")
    root_kv = rpc_pb2_grpc.KVStub(channel_as(n1, tls, "root"))
    root_kv.Put(rpc_pb2.PutRequest(key=b"/x", value=b"1"), timeout=T)  # CN root: everything
    stranger = rpc_pb2_grpc.KVStub(channel_as(n1, tls, "stranger"))  # no such user
    with pytest.raises(grpc.RpcError) as e:
        stranger.Range(rpc_pb2.RangeRequest(key=b"/t/a"), timeout=T)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # a token wins over the certificate: root's token on the "client" certificate
    token = a.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="cn-root-pw"),
                           timeout=T).token
    assert kv.Range(rpc_pb2.RangeRequest(key=b"/x"), metadata=[("token", token)],
                    timeout=T).kvs[0].value == b"1"

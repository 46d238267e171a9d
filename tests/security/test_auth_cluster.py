"""Auth on a real 3-node accord cluster: replicated users and roles, tokens that work on
every member, revocation that takes effect at once everywhere, state that survives
restarts and snapshots, enforcement on Watch and Lease, JWT tokens, and logs that never
hold a password or a token."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from accord.proto import auth_pb2, rpc_pb2, rpc_pb2_grpc
from tests.integration.cluster import ProcCluster, ProcNode

T = 10.0
PASSWORDS = {"root": "root-secret-77", "u": "u-secret-88"}


def auth(node: ProcNode) -> rpc_pb2_grpc.AuthStub:
    return rpc_pb2_grpc.AuthStub(node.channel())


def md(token: str) -> list[tuple[str, str]]:
    return [("token", token)]


def login(node: ProcNode, user: str, password: str | None = None) -> str:
    """Authenticate as etcd's clients do: again on UNAVAILABLE (a simple token is
    proposed through the meta group, which may be between leaders after a restart in an
    earlier test), never on a refusal."""
    for attempt in range(5):
        try:
            resp = auth(node).Authenticate(rpc_pb2.AuthenticateRequest(
                name=user, password=password or PASSWORDS[user]), timeout=T)
            return str(resp.token)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == 4:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def error(call: object, *args: object, **kw: object) -> tuple[grpc.StatusCode, str]:
    try:
        call(*args, timeout=T, **kw)  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code(), e.details()
    raise AssertionError("the call succeeded")


def setup_users(node: ProcNode) -> None:
    a = auth(node)
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password=PASSWORDS["root"]), timeout=T)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=T)
    a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="r"), timeout=T)
    a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="r", perm=auth_pb2.Permission(
        permType=auth_pb2.Permission.READWRITE, key=b"/t/", range_end=b"/t0")), timeout=T)
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password=PASSWORDS["u"]), timeout=T)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="u", role="r"), timeout=T)
    a.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=T)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def cluster(tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[ProcCluster]:
    """Three members; with two workers, auth lives in worker 0's meta group and the
    other worker checks callers on its copy (a token it does not know yet looked up
    again once the copy caught up), and a forwarded call is checked again where it is
    served (``docs/workers.md``)."""
    c = ProcCluster(tmp_path_factory.mktemp("auth-cluster"), 3, workers=request.param,
                    extra=("--snapshot-count", "16"))
    c.start_all()
    try:
        c.leader()
        setup_users(c.nodes[0])
        yield c
    finally:
        c.stop_all()


def test_a_token_from_one_member_works_on_every_member(cluster: ProcCluster) -> None:
    token = login(cluster.nodes[0], "u")
    for i, node in enumerate(cluster.nodes):
        node.kv().Put(rpc_pb2.PutRequest(key=f"/t/{i}".encode(), value=b"v"), metadata=md(token),
                      timeout=T)
        assert node.kv().Range(rpc_pb2.RangeRequest(key=b"/t/", range_end=b"/t0"),
                               metadata=md(token), timeout=T).count == i + 1
        assert error(node.kv().Put, rpc_pb2.PutRequest(key=b"/x", value=b"v"),
                     metadata=md(token)) == (grpc.StatusCode.PERMISSION_DENIED,
                                             "etcdserver: permission denied")
        assert error(node.kv().Range, rpc_pb2.RangeRequest(key=b"/t/0")) == (
            grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
        assert error(node.kv().Range, rpc_pb2.RangeRequest(key=b"/t/0"),
                     metadata=md(token + "x")) == (grpc.StatusCode.UNAUTHENTICATED,
                                                   "etcdserver: invalid auth token")
        for _ in range(3):  # fresh connections: with workers, either one takes it
            node.close_channel()
            # The metadata that names the caller of a call forwarded between a node's
            # workers (or marks a recipe's own step) admits nobody when a client sends it.
            for claim in (("accord-forwarded-user", "root"), ("accord-forwarded-internal", "1")):
                assert error(node.kv().Put, rpc_pb2.PutRequest(key=b"/t/claimed", value=b"v"),
                             metadata=[claim]) == (
                    grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
            # A token issued through one worker is known at once by the other.
            fresh = login(node, "u")
            node.close_channel()
            assert node.kv().Range(rpc_pb2.RangeRequest(key=b"/t/0"), metadata=md(fresh),
                                   timeout=T).count == 1


def test_watch_and_lease_revoke_are_enforced(cluster: ProcCluster) -> None:
    n2 = cluster.nodes[1]
    token, root = login(n2, "u"), login(n2, "root")
    watch = rpc_pb2_grpc.WatchStub(n2.channel())
    reqs = [rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"/x"))]
    first = next(iter(watch.Watch(iter(reqs), metadata=md(token), timeout=T)))
    assert (first.created, first.canceled, first.watch_id) == (True, True, -1)
    assert first.cancel_reason == ("rpc error: code = PermissionDenied desc = "
                                   "etcdserver: permission denied")
    lease = rpc_pb2_grpc.LeaseStub(n2.channel())
    lid = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), metadata=md(root), timeout=T).ID
    n2.kv().Put(rpc_pb2.PutRequest(key=b"/x/leased", value=b"v", lease=lid), metadata=md(root),
                timeout=T)
    assert error(lease.LeaseRevoke, rpc_pb2.LeaseRevokeRequest(ID=lid), metadata=md(token)) == (
        grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    assert error(n2.kv().Put, rpc_pb2.PutRequest(key=b"/t/leased", value=b"v", lease=lid),
                 metadata=md(token))[0] == grpc.StatusCode.PERMISSION_DENIED
    lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lid), metadata=md(root), timeout=T)
    assert error(rpc_pb2_grpc.MaintenanceStub(n2.channel()).Hash, rpc_pb2.HashRequest(),
                 metadata=md(token)) == (grpc.StatusCode.UNKNOWN, "auth: permission denied")
    assert error(rpc_pb2_grpc.ClusterStub(n2.channel()).MemberRemove,
                 rpc_pb2.MemberRemoveRequest(ID=1), metadata=md(token)) == (
        grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")


def test_a_revoke_on_one_member_stops_the_token_on_another_at_once(cluster: ProcCluster) -> None:
    n1, n2, n3 = cluster.nodes
    token, root = login(n3, "u"), login(n1, "root")
    n3.kv().Put(rpc_pb2.PutRequest(key=b"/t/r", value=b"v"), metadata=md(token), timeout=T)
    before = auth(n1).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=T).authRevision
    auth(n1).RoleRevokePermission(rpc_pb2.AuthRoleRevokePermissionRequest(
        role="r", key=b"/t/", range_end=b"/t0"), metadata=md(root), timeout=T)
    # no wait, no retry: the very next request on another member is refused
    assert error(n3.kv().Range, rpc_pb2.RangeRequest(key=b"/t/r"), metadata=md(token)) == (
        grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    assert error(n2.kv().Put, rpc_pb2.PutRequest(key=b"/t/r", value=b"w"), metadata=md(token)) == (
        grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    assert auth(n2).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=T).authRevision == before + 1
    auth(n2).RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
        name="r", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"/t/",
                                           range_end=b"/t0")), metadata=md(root), timeout=T)
    assert n1.kv().Range(rpc_pb2.RangeRequest(key=b"/t/r"), metadata=md(token),
                         timeout=T).kvs[0].value == b"v"
    # a new password kills the user's tokens on every member
    auth(n1).UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(
        name="u", password="u-secret-99"), metadata=md(root), timeout=T)
    assert error(n2.kv().Range, rpc_pb2.RangeRequest(key=b"/t/r"), metadata=md(token)) == (
        grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
    PASSWORDS["u"] = "u-secret-99"


def test_auth_survives_restarts_and_snapshots(cluster: ProcCluster) -> None:
    n1, _, n3 = cluster.nodes
    root = login(n1, "root")
    n1.kv().Put(rpc_pb2.PutRequest(key=b"/t/r", value=b"v"), metadata=md(root), timeout=T)
    for i in range(40):  # past --snapshot-count: the meta group snapshots and truncates
        auth(n1).RoleAdd(rpc_pb2.AuthRoleAddRequest(name=f"extra{i}"), metadata=md(root),
                         timeout=T)
    status = auth(n1).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=T)
    token = login(n3, "u")
    cluster.stop(n3)
    cluster.start(n3)
    cluster.wait_serving(n3)
    deadline = time.monotonic() + 30
    while True:
        try:
            got = auth(n3).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=2)
            if got.authRevision == status.authRevision:
                break
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, "restarted member never caught up"
        time.sleep(0.1)
    assert got.enabled
    roles = auth(n3).RoleList(rpc_pb2.AuthRoleListRequest(), metadata=md(root), timeout=T).roles
    assert {f"extra{i}" for i in range(40)} <= set(roles)
    # the simple token issued before the restart still works there (replicated, not local)
    assert n3.kv().Range(rpc_pb2.RangeRequest(key=b"/t/r"), metadata=md(token),
                         timeout=T).count == 1
    assert login(n3, "u")


def test_no_password_or_token_in_any_log(cluster: ProcCluster) -> None:
    tokens = [login(n, "u") for n in cluster.nodes] + [login(cluster.nodes[0], "root")]
    with pytest.raises(grpc.RpcError):
        login(cluster.nodes[1], "u", "wrong-secret-55")
    logs = "".join(n.log_path.read_text(errors="replace") for n in cluster.nodes)
    assert "accord node" in logs  # the logs are there and hold something
    for secret in [*PASSWORDS.values(), "root-secret-77", "u-secret-88", "wrong-secret-55",
                   *tokens, *(t.split(".")[0] for t in tokens)]:
        assert secret not in logs


@pytest.fixture()
def jwt_node(tmp_path: Path) -> Iterator[ProcNode]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = tmp_path / "jwt.key", tmp_path / "jwt.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    spec = f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256,ttl=10m"
    c = ProcCluster(tmp_path, 1, extra=("--auth-token", spec, "--bcrypt-cost", "4"))
    c.start_all()
    try:
        c.leader()
        setup_users(c.nodes[0])
        yield c.nodes[0]
    finally:
        c.stop_all()


def test_jwt_tokens_carry_the_auth_revision(jwt_node: ProcNode) -> None:
    token = login(jwt_node, "u")
    assert token.count(".") == 2  # header.claims.signature
    jwt_node.kv().Put(rpc_pb2.PutRequest(key=b"/t/j", value=b"v"), metadata=md(token), timeout=T)
    root = login(jwt_node, "root")
    auth(jwt_node).RoleAdd(rpc_pb2.AuthRoleAddRequest(name="later"), metadata=md(root), timeout=T)
    assert error(jwt_node.kv().Range, rpc_pb2.RangeRequest(key=b"/t/j"), metadata=md(token)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: revision of auth store is old")
    fresh = login(jwt_node, "u")
    assert jwt_node.kv().Range(rpc_pb2.RangeRequest(key=b"/t/j"), metadata=md(fresh),
                               timeout=T).count == 1
    forged = fresh[:-4] + ("AAAA" if not fresh.endswith("AAAA") else "BBBB")
    assert error(jwt_node.kv().Range, rpc_pb2.RangeRequest(key=b"/t/j"), metadata=md(forged)) == (
        grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")


def test_locks_and_accord_services_need_their_permissions(cluster: ProcCluster) -> None:
    from accord.proto import scheduling_pb2, scheduling_pb2_grpc, v3lock_pb2, v3lock_pb2_grpc

    n1 = cluster.nodes[0]
    token, root = login(n1, "u"), login(n1, "root")
    lease = rpc_pb2_grpc.LeaseStub(n1.channel()).LeaseGrant(
        rpc_pb2.LeaseGrantRequest(TTL=30), metadata=md(token), timeout=T).ID
    locks = v3lock_pb2_grpc.LockStub(n1.channel())
    held = locks.Lock(v3lock_pb2.LockRequest(name=b"/t/lock", lease=lease), metadata=md(token),
                      timeout=T)
    assert held.key.startswith(b"/t/lock/")
    locks.Unlock(v3lock_pb2.UnlockRequest(key=held.key), metadata=md(token), timeout=T)
    # etcd 3.4's lock server answers code Unknown with etcd's message
    assert error(locks.Lock, v3lock_pb2.LockRequest(name=b"/x/lock", lease=lease),
                 metadata=md(token)) == (grpc.StatusCode.UNKNOWN, "etcdserver: permission denied")
    sched = scheduling_pb2_grpc.SchedulerStub(n1.channel())
    assert error(sched.ListJobs, scheduling_pb2.ListJobsRequest(), metadata=md(token)) == (
        grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    assert error(sched.ListJobs, scheduling_pb2.ListJobsRequest())[1] == (
        "etcdserver: user name is empty")
    sched.ListJobs(scheduling_pb2.ListJobsRequest(), metadata=md(root), timeout=T)
    auth(n1).RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
        name="r", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READ,
                                           key=b"__accord/scheduling")), metadata=md(root),
        timeout=T)
    sched.ListJobs(scheduling_pb2.ListJobsRequest(), metadata=md(token), timeout=T)
    assert error(sched.CancelJob, scheduling_pb2.CancelJobRequest(job_id="nope"),
                 metadata=md(token))[0] == grpc.StatusCode.PERMISSION_DENIED
    # Checkpoints: a job's manifests are granted as __accord/checkpoints/<job>.
    from accord.proto import checkpoints_pb2, checkpoints_pb2_grpc

    ckpt = checkpoints_pb2_grpc.CheckpointsStub(n1.channel())
    steps = checkpoints_pb2.ListStepsRequest(job="j1")
    assert error(ckpt.ListSteps, steps, metadata=md(token)) == (
        grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    auth(n1).RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
        name="r", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READ,
                                           key=b"__accord/checkpoints/j1")), metadata=md(root),
        timeout=T)
    code = error(ckpt.ListSteps, steps, metadata=md(token))[0]  # past auth: the job is unknown
    assert code == grpc.StatusCode.NOT_FOUND
    assert error(ckpt.Begin, checkpoints_pb2.BeginRequest(job="j1", step=1),
                 metadata=md(token))[0] == grpc.StatusCode.PERMISSION_DENIED  # read only
    assert error(ckpt.ListJobs, checkpoints_pb2.ListJobsRequest(),
                 metadata=md(token))[0] == grpc.StatusCode.PERMISSION_DENIED  # one job only
    ckpt.ListJobs(checkpoints_pb2.ListJobsRequest(), metadata=md(root), timeout=T)

"""What each request needs (``needs.py``): etcd checks every branch of a Txn, nested ones
included, and READ as well as WRITE where a request returns previous values."""

from __future__ import annotations

from accord.proto import rpc_pb2
from accord.services.auth.needs import (
    READ,
    WRITE,
    delete_needs,
    put_needs,
    txn_leases,
    txn_needs,
)


def test_a_txn_needs_both_branches_and_nested_txns() -> None:
    inner = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"c2")],
        failure=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"deep", lease=7))])
    txn = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"c1", range_end=b"c9")],
        success=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"r"))],
        failure=[rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(
                     key=b"d", range_end=b"e", prev_kv=True)),
                 rpc_pb2.RequestOp(request_txn=inner)])
    assert list(txn_needs(txn)) == [
        (b"c1", b"c9", READ), (b"r", b"", READ), (b"d", b"e", WRITE), (b"d", b"e", READ),
        (b"c2", b"", READ), (b"deep", b"", WRITE)]
    assert list(txn_leases(txn)) == [7]


def test_prev_kv_needs_read_too() -> None:
    assert list(put_needs(rpc_pb2.PutRequest(key=b"k"))) == [(b"k", b"", WRITE)]
    assert list(put_needs(rpc_pb2.PutRequest(key=b"k", prev_kv=True))) == [
        (b"k", b"", WRITE), (b"k", b"", READ)]
    assert list(delete_needs(rpc_pb2.DeleteRangeRequest(key=b"k", prev_kv=True))) == [
        (b"k", b"", WRITE), (b"k", b"", READ)]


def test_checkpoint_calls_need_their_job_or_every_job() -> None:
    """A job's checkpoints are granted as ``__accord/checkpoints/<job>`` (docs/security.md)."""
    from accord.proto import checkpoints_pb2 as ck
    from accord.services.auth.interceptor import rule_of

    def needs_of(method: str, req: object) -> list[tuple[bytes, bytes, object]]:
        rule = rule_of(f"/accord.checkpoints.v1.Checkpoints/{method}")
        assert rule.needs is not None
        return list(rule.needs(req))

    job = b"__accord/checkpoints/j7"
    every = (b"__accord/checkpoints/", b"__accord/checkpoints0", READ)
    assert needs_of("Begin", ck.BeginRequest(job="j7")) == [(job, b"", WRITE)]
    assert needs_of("Commit", ck.CommitRequest(job="j7")) == [(job, b"", WRITE)]
    assert needs_of("RegisterShards", ck.RegisterShardsRequest(job="j7")) == [(job, b"", WRITE)]
    assert needs_of("GetManifest", ck.GetManifestRequest(job="j7")) == [(job, b"", READ)]
    assert needs_of("WatchLatest", ck.WatchLatestRequest(job="j7")) == [(job, b"", READ)]
    assert needs_of("ListJobs", ck.ListJobsRequest()) == [every]
    assert needs_of("GC", ck.GCRequest(dry_run=True)) == [every]
    assert needs_of("GC", ck.GCRequest()) == [(every[0], every[1], WRITE)]
    assert needs_of("GC", ck.GCRequest(jobs=["j7"])) == [(job, b"", WRITE)]
    assert needs_of("ConfirmDeleted", ck.ConfirmDeletedRequest()) == [(every[0], every[1], WRITE)]


def test_every_scheduler_call_has_its_rule_and_mutations_need_write() -> None:
    """Every method of the Scheduler service is in the table (one missing would need
    root, ``rule_of``), and the calls that change jobs (Hold and Release too) need WRITE
    on ``__accord/scheduling`` (docs/security.md)."""
    from accord.proto import scheduling_pb2
    from accord.services.auth.interceptor import RULES, rule_of

    service = scheduling_pb2.DESCRIPTOR.services_by_name["Scheduler"]
    for m in service.methods:
        assert f"/{service.full_name}/{m.name}" in RULES, m.name
    key = b"__accord/scheduling"
    for name in ("SubmitJob", "CancelJob", "HoldJob", "ReleaseJob", "JobFinished"):
        rule = rule_of(f"/{service.full_name}/{name}")
        assert rule.needs is not None
        assert list(rule.needs(None)) == [(key, b"", WRITE)], name
    reads = rule_of(f"/{service.full_name}/ListJobs").needs
    assert reads is not None and list(reads(None)) == [(key, b"", READ)]

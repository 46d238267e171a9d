"""python-etcd3 0.12's transaction tests, run as a subprocess against one endpoint.

Usage: PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python python etcd3_txn.py HOST PORT

The scenarios of the client's own test suite (``test_transaction_success``,
``_failure``, ``test_nested_transactions``, ``test_transaction_range_conditions``,
``test_replace_success``/``_fail``), with ``etcdctl put`` replaced by the client's put.
Their keys (``/doot/txn1``, ``/doot/txn2``, ``/doot/key1`` ...) are of different
partitions, so on a sharded accord most of these Txns span shards. Prints one line per
scenario and ``ALL OK``; any failure raises and exits non-zero.
"""

from __future__ import annotations

import sys

import etcd3
import etcd3.utils


def main(host: str, port: int) -> None:
    etcd = etcd3.client(host=host, port=port, timeout=10)
    t = etcd.transactions

    def clean() -> None:
        etcd.delete_prefix("/doot/")

    clean()
    etcd.put("/doot/txn", "dootdoot")
    etcd.transaction(compare=[t.value("/doot/txn") == "dootdoot"],
                     success=[t.put("/doot/txn", "success")],
                     failure=[t.put("/doot/txn", "failure")])
    assert etcd.get("/doot/txn")[0] == b"success"
    print("test_transaction_success ok", flush=True)

    clean()
    etcd.put("/doot/txn", "notdootdoot")
    etcd.transaction(compare=[t.value("/doot/txn") == "dootdoot"],
                     success=[t.put("/doot/txn", "success")],
                     failure=[t.put("/doot/txn", "failure")])
    assert etcd.get("/doot/txn")[0] == b"failure"
    print("test_transaction_failure ok", flush=True)

    clean()
    etcd.transaction(
        compare=[],
        success=[t.put("/doot/txn1", "1"),
                 t.txn(compare=[], success=[t.put("/doot/txn2", "2")], failure=[])],
        failure=[],
    )
    assert etcd.get("/doot/txn1")[0] == b"1"
    assert etcd.get("/doot/txn2")[0] == b"2"
    one, two = etcd.get("/doot/txn1")[1], etcd.get("/doot/txn2")[1]
    assert one.mod_revision == two.mod_revision, (one.mod_revision, two.mod_revision)
    print("test_nested_transactions ok", flush=True)

    clean()
    etcd.put("/doot/key1", "dootdoot")
    etcd.put("/doot/key2", "notdootdoot")
    range_end = etcd3.utils.increment_last_byte(etcd3.utils.to_bytes("/doot/"))
    compare = [t.value("/doot/", range_end) == "dootdoot"]
    status, _ = etcd.transaction(compare=compare, success=[], failure=[])
    assert not status
    etcd.put("/doot/key2", "dootdoot")
    status, _ = etcd.transaction(compare=compare, success=[], failure=[])
    assert status
    print("test_transaction_range_conditions ok", flush=True)

    clean()
    etcd.put("/doot/thing", "toot")
    assert etcd.replace("/doot/thing", "toot", "doot") is True
    assert etcd.get("/doot/thing")[0] == b"doot"
    print("test_replace_success ok", flush=True)

    clean()
    etcd.put("/doot/thing", "boot")
    assert etcd.replace("/doot/thing", "toot", "doot") is False
    assert etcd.get("/doot/thing")[0] == b"boot"
    print("test_replace_fail ok", flush=True)

    # Beyond the suite: a compare-and-swap over two keys on two partitions, both sides.
    clean()
    etcd.put("/doot/a", "1")
    etcd.put("/doot/b", "1")
    _va, ma = etcd.get("/doot/a")
    _vb, mb = etcd.get("/doot/b")
    ok, _ = etcd.transaction(
        compare=[t.mod("/doot/a") == ma.mod_revision, t.mod("/doot/b") == mb.mod_revision],
        success=[t.put("/doot/a", "0"), t.put("/doot/b", "2")], failure=[])
    assert ok is True
    ok, resp = etcd.transaction(
        compare=[t.mod("/doot/a") == ma.mod_revision],
        success=[t.put("/doot/a", "lost"), t.put("/doot/b", "lost")],
        failure=[t.get("/doot/a"), t.get("/doot/b")])
    assert ok is False and [r[0][0] for r in resp] == [b"0", b"2"], resp
    clean()
    print("two-key compare-and-swap ok", flush=True)
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""Round trips with the ``etcd3`` PyPI client (python-etcd3 0.12), run as a subprocess.

Usage: PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python python etcd3_roundtrip.py HOST PORT
(etcd3's generated code needs the pure-python protobuf runtime, and its descriptors would
clash with accord's in one process). Prints one line per step, ``ALL OK`` at the end;
any failure raises and exits non-zero.
"""

from __future__ import annotations

import sys
import threading

import etcd3


def main(host: str, port: int) -> None:
    c = etcd3.client(host=host, port=port, timeout=10)

    # KV
    c.put("/e3/a", "1")
    c.put("/e3/b", "2")
    value, meta = c.get("/e3/a")
    assert value == b"1" and meta.key == b"/e3/a" and meta.version == 1, (value, meta)
    assert sorted(v for v, _m in c.get_prefix("/e3/")) == [b"1", b"2"]
    assert c.put_if_not_exists("/e3/a", "x") is False
    assert c.put_if_not_exists("/e3/new", "x") is True
    assert c.replace("/e3/a", "1", "1b") is True
    ok, _responses = c.transaction(
        compare=[c.transactions.version("/e3/b") > 0],
        success=[c.transactions.put("/e3/b", "2b")],
        failure=[],
    )
    assert ok is True and c.get("/e3/b")[0] == b"2b"
    assert c.delete("/e3/new") is True
    c.delete_prefix("/e3/")
    assert list(c.get_prefix("/e3/")) == []
    print("kv ok", flush=True)

    # watch: one shared stream, two watches, events in order
    events: list[tuple[str, bytes]] = []
    done = threading.Event()

    def cb(resp: object) -> None:
        for ev in resp.events:  # type: ignore[attr-defined]
            events.append((type(ev).__name__, ev.key))
        if len(events) >= 3:
            done.set()

    w1 = c.add_watch_prefix_callback("/e3w/", cb)
    w2 = c.add_watch_callback("/e3x", cb)
    c.put("/e3w/1", "a")
    c.put("/e3x", "b")
    c.delete("/e3w/1")
    assert done.wait(10), events
    assert events == [("PutEvent", b"/e3w/1"), ("PutEvent", b"/e3x"), ("DeleteEvent", b"/e3w/1")]
    c.cancel_watch(w1)
    c.cancel_watch(w2)
    it, cancel = c.watch("/e3once")
    threading.Timer(0.3, lambda: c.put("/e3once", "z")).start()
    ev = next(it)
    assert ev.key == b"/e3once" and ev.value == b"z"
    cancel()
    print("watch ok", flush=True)

    # lease
    lease = c.lease(30)
    c.put("/e3l", "v", lease=lease)
    assert 0 < lease.remaining_ttl <= 30
    assert lease.granted_ttl == 30
    assert lease.keys == [b"/e3l"]
    lease.refresh()
    lease.revoke()
    assert c.get("/e3l")[0] is None
    print("lease ok", flush=True)

    # lock: the holder's key blocks a second lock. (python-etcd3 0.12's retry loop is
    # broken with current tenacity -- its wait() signature -- so a contended acquire()
    # cannot be exercised; each acquire below succeeds on its first attempt.)
    lock = c.lock("e3lock", ttl=10)
    assert lock.acquire(timeout=5)
    assert lock.is_acquired()
    other = c.lock("e3lock", ttl=10)
    assert not other.is_acquired()
    assert lock.refresh()[0].TTL == 10
    assert lock.release()
    assert not lock.is_acquired()
    assert other.acquire(timeout=5)
    assert other.is_acquired()
    assert other.release()
    print("lock ok", flush=True)

    # status (Maintenance.Status + Cluster.MemberList)
    st = c.status()
    assert st.version and st.leader is not None and st.leader.id == c.members.__next__().id
    print("status ok", flush=True)
    c.close()
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

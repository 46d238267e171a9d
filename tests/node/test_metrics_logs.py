"""A real daemon's log lines in both formats: ids on every line, a request's id, no secrets."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import grpc
import pytest

from accord.proto import rpc_pb2, rpc_pb2_grpc
from tests.integration.cluster import ProcCluster, free_ports

GOSSIP_KEY = "00112233445566778899aabbccddeeff"


def _added_via_request(c: ProcCluster, request_id: str, group_mark: str) -> str:
    """Add a learner member through node 1 with ``request_id``, wait until the daemon
    logged the addition and a group's change for it (``group_mark`` in a line), stop it,
    and return its log."""
    (peer,) = free_ports(1)
    node = c.nodes[0]
    stub = rpc_pb2_grpc.ClusterStub(node.channel())
    deadline = time.monotonic() + 30
    while True:
        try:
            stub.MemberAdd(rpc_pb2.MemberAddRequest(peerURLs=[f"http://127.0.0.1:{peer}"],
                                                    isLearner=True),
                           timeout=5, metadata=(("x-request-id", request_id),))
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, c.log(node)
            time.sleep(0.2)
    while True:
        text = node.log_path.read_text()
        if "added (peer URLs" in text and group_mark in text:
            break
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.2)
    c.stop(node)
    return node.log_path.read_text()


def _daemon_log(tmp_path: Path, flags: tuple[str, ...], request_id: str, group_mark: str) -> str:
    """The log of a one-node daemon run with ``flags`` (and a gossip key) that served one
    MemberAdd named ``request_id``."""
    c = ProcCluster(tmp_path, 1, extra=(*flags, "--gossip-key", GOSSIP_KEY))
    c.start_all()
    try:
        return _added_via_request(c, request_id, group_mark)
    finally:
        c.stop_all()


GRPC_CORE_LINE = re.compile(r"^[IWEF]\d{4} ")
"""gRPC's C core writes its own lines to stderr (not through Python's logging)."""


@pytest.mark.parametrize("flag", [("--log-format", "json"), ()], ids=["json", "default"])
def test_json_lines_name_node_and_request(tmp_path: Path, flag: tuple[str, ...]) -> None:
    text = _daemon_log(tmp_path, (*flag, "--log-level", "debug"), "req-json-7", '"group": ')
    events = []
    for line in text.splitlines():
        if line.startswith("accord node ") or GRPC_CORE_LINE.match(line):  # stdout's start line
            continue
        events.append(json.loads(line))  # every log line is one JSON object
    assert events
    assert all(e["node"] == "n1" and re.fullmatch(r"[0-9a-f]+", e["member"]) for e in events)
    assert all({"ts", "level", "logger", "msg"} <= e.keys() for e in events)
    added = [e for e in events if "added (peer URLs" in e["msg"]]
    assert added and added[0]["request"] == "req-json-7"
    grouped = [e for e in events if "group" in e]
    assert grouped and all(f"group {e['group']}:" in e["msg"] for e in grouped)
    assert GOSSIP_KEY not in text


def test_console_lines_are_for_people(tmp_path: Path) -> None:
    text = _daemon_log(tmp_path, ("--log-format", "console", "--log-level", "info"),
                       "req-console-9", " group=")
    line = next(ln for ln in text.splitlines() if "added (peer URLs" in ln)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO accord\.members "
                    r"\[n1 [0-9a-f]+\] request=req-console-9: member [0-9a-f]+ added", line), line
    assert re.search(r"\] group=\d+: group \d+: ", text)
    assert not any(ln.lstrip().startswith("{") for ln in text.splitlines())
    assert GOSSIP_KEY not in text


def test_log_level_drops_the_lines_below_it(tmp_path: Path) -> None:
    c = ProcCluster(tmp_path, 1, extra=("--log-format", "json", "--log-level", "warn"))
    c.start_all()
    try:
        (peer,) = free_ports(1)
        rpc_pb2_grpc.ClusterStub(c.nodes[0].channel()).MemberAdd(
            rpc_pb2.MemberAddRequest(peerURLs=[f"http://127.0.0.1:{peer}"], isLearner=True),
            timeout=30)
        time.sleep(1.0)  # the info line of the addition would be written by now
        c.stop(c.nodes[0])
    finally:
        c.stop_all()
    text = c.nodes[0].log_path.read_text()
    assert "added (peer URLs" not in text
    assert '"level": "info"' not in text


def test_bad_log_format_is_refused(tmp_path: Path) -> None:
    c = ProcCluster(tmp_path, 1, extra=("--log-format", "xml"))
    node = c.nodes[0]
    c.start(node)
    assert node.proc is not None
    assert node.proc.wait(30) == 2
    assert "log-format 'xml': use json or console" in c.log(node)

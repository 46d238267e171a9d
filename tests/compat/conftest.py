"""Fixtures of the compatibility tests: servers shared per module, killed by PID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.compat.servers import Server, accord_server, etcd_server


@pytest.fixture(scope="module", params=["accord", "etcd"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """accord, then a real etcd: the same client-side expectations must hold for both."""
    if request.param == "accord":
        with accord_server() as s:
            yield s
    else:
        with etcd_server(tmp_path_factory.mktemp("etcd")) as s:
            yield s

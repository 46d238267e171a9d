"""pytest plugin (entry point ``pytest11``: ``accord``): the ``accord_cluster`` fixture.

``accord_cluster`` is a running three-node in-process cluster
(:func:`accord.testing.cluster`) for one test, stopped and deleted after it::

    async def test_config_survives_a_crash(accord_cluster) -> None:
        client = accord_cluster.client()
        await client.put("k", "v")
        await accord_cluster.kill(0)
        assert (await client.get("k")).value == b"v"

It is an asyncio fixture: pytest-asyncio (or another asyncio plugin) runs it. The
cluster module is imported when the fixture is first used, not when pytest starts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from accord.testing import TestCluster

try:
    import pytest_asyncio

    _fixture: Any = pytest_asyncio.fixture
except ImportError:  # another asyncio plugin may run async fixtures
    _fixture = pytest.fixture


@_fixture  # type: ignore[untyped-decorator]
async def accord_cluster(tmp_path: Any) -> AsyncIterator[TestCluster]:
    """A three-node accord cluster in this test's event loop, data under ``tmp_path``."""
    from accord.testing import cluster

    async with cluster(nodes=3, data_dir=tmp_path / "accord") as c:
        yield c

"""One real 3-node cluster shared by the checkpoint tests that do not kill members."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.cluster import ProcCluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("ckpt-cluster"), 3) as c:
        yield c

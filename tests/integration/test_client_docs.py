"""Every ``python`` block of ``docs/client.md`` runs, as printed, against a real cluster.

Each block is a complete program: it is written to a file and run with this venv's
python, ``ACCORD_ENDPOINTS`` naming the three members; it must exit 0 (the blocks assert
what they show).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import ProcCluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcCluster]:
    with ProcCluster(tmp_path_factory.mktemp("docs"), 3) as c:
        c.leader()
        yield c


def test_the_guide_has_its_examples() -> None:
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(cluster: ProcCluster, tmp_path: Path, index: int) -> None:
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index])
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "ACCORD_ENDPOINTS": cluster.endpoints})
    assert out.returncode == 0, f"example {index}:\n{BLOCKS[index]}\n{out.stdout}\n{out.stderr}"

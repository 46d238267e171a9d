"""One rank of a test training job, as its own process: write this rank's numpy arrays as
a safetensors shard (checksummed while written) and register it.

    python -m tests.checkpoints.rank_worker ENDPOINTS JOB STEP TOKEN RANK WORLD BASE_URL

Prints the registered shard as JSON. ``arrays(rank, world)`` is what the test expects
back: rank ``r`` holds rows ``4r..4r+3`` of the global ``w`` and its own ``bias``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from accord.client.sync import SyncClient

ROWS = 4
COLS = 8


def arrays(rank: int, world: int) -> dict[str, np.ndarray]:
    """This rank's tensors (deterministic, so the test can compare)."""
    rng = np.random.default_rng(1000 + rank)
    return {"w": rng.standard_normal((ROWS, COLS)).astype(np.float32),
            "bias": np.full((1, COLS), rank, dtype=np.int64)}


def main(argv: list[str]) -> int:
    endpoints, job, step, token, rank, world, base = argv
    r, w = int(rank), int(world)
    with SyncClient(endpoints) as client:
        writer = client.checkpoints.writer(job, int(step), int(token), base_url=base)
        data = arrays(r, w)
        shard = writer.write_arrays(f"rank-{r}", r, data, slices={
            "w": ((ROWS * w, COLS), (ROWS * r, 0)), "bias": ((w, COLS), (r, 0))})
        remaining = writer.register([shard])
    print(json.dumps({"shard": shard, "remaining": remaining}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

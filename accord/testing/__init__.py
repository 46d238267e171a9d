"""Real accord clusters for your own tests: ``accord.testing.cluster`` and a pytest fixture.

::

    import accord.testing

    async def test_my_service() -> None:
        async with accord.testing.cluster(nodes=3) as c:
            client = c.client()
            await client.put("/cfg/x", "1")
            await c.kill(1)          # node 1 crashes (no leadership handover)
            await client.put("/cfg/x", "2")
            await c.restart(1)       # back on its data directory; it catches up

``cluster`` is defined in :mod:`accord.testing.cluster`; the pytest plugin
(:mod:`accord.testing.pytest_plugin`, registered as a ``pytest11`` entry point) gives
tests an ``accord_cluster`` fixture.
"""

from __future__ import annotations

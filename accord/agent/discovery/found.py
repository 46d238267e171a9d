"""What a vendor probe reports about one accelerator, before it becomes a ``Device``.

Vendor modules fill ``Found`` records; ``inventory`` turns them into the scheduler's
``Device`` (islands from the link graph, PCIe switches from sysfs) and a health list.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Found:
    """One accelerator as its vendor library (or sysfs) describes it."""

    vendor: str
    index: int
    """The index the vendor runtime uses (the visibility-env value)."""
    model: str
    memory: int
    """Bytes."""
    uuid: str = ""
    arch: str = ""
    capability: float = 0.0
    numa: int = -1
    """NUMA node, -1 when unknown."""
    pci_bus: str = ""
    """PCI bus id, ``0000:18:00.0``; lower case."""
    cpus: str = ""
    """CPUs close to the device (``"0-55,112-167"``), empty when unknown."""
    links: set[str] = field(default_factory=set)
    """Fast-link neighbours: other devices' PCI bus ids, or a fabric name (``nvswitch``)."""
    unhealthy: str = ""
    """Why the device must not be used; empty when healthy."""
    mig: tuple[str, ...] = ()
    """UUIDs of the MIG instances on the device (MIG mode on), else empty."""
    extra: dict[str, str | int | float | bool] = field(default_factory=dict)
    """More selector attributes (``mig``, ``mig_instances``). Never a per-device value such
    as the UUID: devices with different attributes are different classes to placement,
    and a multi-device task takes devices of one class."""


def cpu_list(indices: list[int] | set[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indices)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpu_list(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}``; ``ValueError`` on malformed input."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        a = int(lo)
        b = int(hi) if sep else a
        if a < 0 or b < a:
            raise ValueError(f"bad CPU range {part!r}")
        out.update(range(a, b + 1))
    return out


def bitmask_cpus(words: list[int] | tuple[int, ...], bits: int = 64) -> set[int]:
    """CPU indices set in a bit mask given as little-endian words (NVML, amdsmi)."""
    out: set[int] = set()
    for w, word in enumerate(words):
        word = int(word)
        b = 0
        while word:
            if word & 1:
                out.add(w * bits + b)
            word >>= 1
            b += 1
    return out

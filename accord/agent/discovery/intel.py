"""Intel data-center GPUs from the DRM sysfs that Level Zero enumerates.

Level Zero (``ZE_AFFINITY_MASK``) numbers the Intel GPUs in PCI order, which is
the order of their ``/sys/class/drm/cardN`` entries sorted by PCI bus id. A card
counts when its ``device/vendor`` is ``0x8086``, its PCI class is a display
controller (``0x03xxxx``) and it has local memory (discrete: integrated GPUs are
left out): the first of ``_MEMORY_FILES`` that the driver (i915 or xe) exposes. The model is ``intel-<device id>``; ``device/numa_node`` gives
the NUMA node. A card whose driver is unbound is not listed (Level Zero would not
see it either).
"""

from __future__ import annotations

from pathlib import Path

from accord.agent.discovery.found import Found

INTEL = 0x8086
_MEMORY_FILES = ("lmem_total_bytes", "device/lmem_total_bytes", "device/tile0/vram0/size",
                 "device/tile0/physical_vram_size_bytes")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def probe_sysfs(sysfs: Path = Path("/sys")) -> list[Found]:
    """Discrete Intel GPUs, in Level Zero order; empty when there is none."""
    cards: list[tuple[str, Path]] = []
    try:
        entries = list((sysfs / "class/drm").iterdir())
    except OSError:
        return []
    for card in entries:
        if not (card.name.startswith("card") and card.name[4:].isdigit()):
            continue
        dev = card / "device"
        if _int(_read(dev / "vendor")) != INTEL:
            continue
        cls = _int(_read(dev / "class")) or 0
        if cls >> 16 != 0x03 or not (dev / "driver").exists():
            continue
        mem = next((m for f in _MEMORY_FILES if (m := _int(_read(card / f)))), 0)
        if not mem:
            continue  # integrated graphics: no local memory
        try:
            bus = dev.resolve().name.lower()
        except OSError:
            bus = ""
        cards.append((bus, card))
    out: list[Found] = []
    for bus, card in sorted(cards):
        dev = card / "device"
        mem = next((m for f in _MEMORY_FILES if (m := _int(_read(card / f)))), 0)
        did = _int(_read(dev / "device")) or 0
        numa = _int(_read(dev / "numa_node"))
        out.append(Found("intel", len(out), f"intel-{did:04x}", mem, arch="xe", pci_bus=bus,
                         numa=numa if numa is not None and numa >= 0 else -1,
                         extra={"drm": card.name}))
    return out

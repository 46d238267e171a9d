"""Hardware discovery: a machine's accelerators, CPUs, memory and NICs as one ``Node``.

One module per source (``nvidia`` through NVML, ``amd`` through amdsmi or the KFD
topology in sysfs, ``intel`` through the DRM/Level Zero sysfs, ``host`` for CPUs,
NUMA, memory and NICs); ``inventory`` combines them. Each vendor module takes its
library as an argument (the real one is imported lazily when none is given), so the
tests inject recorded outputs and a machine with no accelerator needs nothing.
"""

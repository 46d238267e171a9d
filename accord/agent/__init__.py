"""The node agent: what a machine has (``discovery``) and the tasks it runs (``runner``).

Layer: above ``client``, below ``cli``. ``accord nodes agent`` builds on it: it reports
the machine's inventory to the scheduler, starts the tasks placed on it as child
processes, reports their exits and stops them on cancel or preemption (see
``docs/agent.md``).
"""

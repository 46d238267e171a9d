"""Entry point of ``python -m accord.raft.simulation``."""

from accord.raft.simulation.cli import main

raise SystemExit(main())

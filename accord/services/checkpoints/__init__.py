"""accord.services.checkpoints."""

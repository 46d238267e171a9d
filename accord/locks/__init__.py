"""accord.locks."""

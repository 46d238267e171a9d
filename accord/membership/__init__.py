"""accord.membership."""

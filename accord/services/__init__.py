"""accord.services."""

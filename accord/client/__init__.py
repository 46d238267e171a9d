"""accord.client."""

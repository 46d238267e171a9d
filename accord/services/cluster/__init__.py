"""accord.services.cluster."""

"""accord.services.scheduling."""

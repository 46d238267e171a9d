"""accord.services.kv."""

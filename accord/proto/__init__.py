"""accord.proto."""

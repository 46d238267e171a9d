"""Tools the tests use: real processes and file systems that stand in for the world."""

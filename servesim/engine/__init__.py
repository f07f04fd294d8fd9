"""The jitted serving engine: event loop, codes, the Python side that feeds it."""

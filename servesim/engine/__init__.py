"""The jitted serving engine: event loop, codes, presets."""

"""wyoming-pivoice: a fully local voice assistant for the Raspberry Pi 5."""

__version__ = "0.1.0"

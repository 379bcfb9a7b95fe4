"""Wyoming, hardened, for every endpoint that reads an untrusted peer (design.md): frames
read bounded (framing.py), connections with deadlines, refuse-and-linger and a bounded
outbox (hardened.py), and the one enum of error codes (errors.py)."""

"""The Home Assistant front: machine.py (the pure state machine), adapter.py (its I/O: the
listener, the speaker, HA's events, the clock), connection.py (HA's connections, on
wire/hardened.py), info.py (what `describe` answers), follow.py (our server's reply, followed),
sounds.py (the sounds it makes itself)."""

"""`wyoming-pivoice doctor`: checks what the Pi needs for snappy local voice, one line each.

cli.py parses the options and prints the report; registry.py lists every check once, in
report order; base.py has what they share (Check, Finding, Status, Machine); the checks
live by area: system.py (/sys, /proc, llama.cpp's build), audio.py (PortAudio, echo
cancellation), models.py (the model files), remote.py (the remote LLM engine).
"""

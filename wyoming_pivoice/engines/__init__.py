"""Model engines. None of them knows about Wyoming; all blocking calls run off the event loop."""

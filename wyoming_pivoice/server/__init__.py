"""The Wyoming server: ASR, conversation (handle) and TTS in one endpoint.

What a host (the lab's bench, a test) may use is exported here; imported on first use
(exports.py says why)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exports import lazy_exports, names

_EXPORTS = {
    ".cli": ("settings_from_argv",),
    ".knowledge": ("KnowledgeBase", "KnowledgeSettings", "TurnNotes"),
}
if TYPE_CHECKING:  # the same names, for the type checker (tests/test_layout.py: they agree)
    from .cli import settings_from_argv
    from .knowledge import KnowledgeBase, KnowledgeSettings, TurnNotes

__all__ = names(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

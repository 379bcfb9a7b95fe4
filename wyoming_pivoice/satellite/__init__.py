"""The on-device satellite: capture → VAD → ASR → LLM → TTS → playback.

What a host (the lab's bench and room, a test) may use is exported here; the modules are the
satellite's own and may move. Imported on first use (exports.py says why)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exports import lazy_exports, names

_EXPORTS = {
    ".endpoint": ("EndpointKind", "Endpointer", "policy_from"),
    ".standalone.pipeline": ("Satellite", "make_stages"),
    ".protocols": ("Transcriber",),
    ".settings": ("EchoSettings", "SatelliteSettings", "VadSettings"),
    ".stages": ("ServerLink",),
    ".turn_policy": ("Evidence", "TurnPolicy"),
}
if TYPE_CHECKING:  # the same names, for the type checker (tests/test_layout.py: they agree)
    from .endpoint import Endpointer, EndpointKind, policy_from
    from .protocols import Transcriber
    from .settings import EchoSettings, SatelliteSettings, VadSettings
    from .stages import ServerLink
    from .standalone.pipeline import Satellite, make_stages
    from .turn_policy import Evidence, TurnPolicy

__all__ = names(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

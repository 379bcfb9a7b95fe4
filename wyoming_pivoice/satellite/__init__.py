"""The on-device satellite: capture → VAD → ASR → LLM → TTS → playback."""

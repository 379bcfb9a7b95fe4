"""The Wyoming server: ASR, conversation (handle) and TTS in one endpoint."""

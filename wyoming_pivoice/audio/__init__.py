"""The physical ends of the voice chain, no Wyoming: the format (format.py), PCM conversion
(pcm.py), pacing and the audio threads' priority (pacing.py), mic and speaker commands
(commands.py), microphones (mic.py), speakers (speaker.py), the echo canceller (echo.py) and
the real-time core that runs capture, AEC3 and the VAD on its own thread (core.py)."""

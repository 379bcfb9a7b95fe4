"""The add-on's remote LLM options become the server's --llm-* flags; the key stays out of
the command line and the log."""

from __future__ import annotations

from pathlib import Path

import yaml

from .test_addon import ADDON, DEFAULT_SERVER, parses, run_addon


def test_remote_llm_options(tmp_path: Path) -> None:
    options = {
        **yaml.safe_load((ADDON / "config.yaml").read_text())["options"],
        "llm_url": "http://192.168.1.20:8080/v1",
        "llm_api_key": "sk-secret-4711",
        "llm_remote_model": "qwen2.5-7b-instruct",
        "llm_fallback": "local",
    }
    server, _, _, log = run_addon(tmp_path, options, satellite=False)
    assert server == [
        *DEFAULT_SERVER,
        "--llm-url", "http://192.168.1.20:8080/v1",
        "--llm-remote-model", "qwen2.5-7b-instruct",
        "--llm-fallback", "local",
    ]  # fmt: skip
    assert "sk-secret-4711" not in log
    parses(server)

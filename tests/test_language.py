"""--language: one option sets the pipeline's language (ASR, the voice, the system prompt),
and `describe` lists the languages actually served; the splitter's CJK rules need no
option (test_text.py)."""

from __future__ import annotations

import pytest

from wyoming_pivoice.__main__ import build_parser
from wyoming_pivoice.catalogue import SYSTEM_PROMPTS
from wyoming_pivoice.server.cli import settings_from_args
from wyoming_pivoice.server.services import Services
from wyoming_pivoice.settings import ServerSettings


def server_settings(*argv: str) -> ServerSettings:
    return settings_from_args(build_parser("server").parse_args(["server", *argv]))


def served(settings: ServerSettings) -> dict[str, list[str]]:
    """The languages of each service in the `info` describe answers (nothing loaded)."""
    info = Services.from_settings(settings).description.info().event().data
    return {
        "asr": info["asr"][0]["models"][0]["languages"],
        "tts": info["tts"][0]["voices"][0]["languages"],
        "handle": info["handle"][0]["models"][0]["languages"],
    }


def test_the_default_is_english_everywhere() -> None:
    settings = server_settings()
    assert settings.asr.language == "en" and settings.tts.voice == "embedded"
    assert settings.llm.system_prompt == SYSTEM_PROMPTS["en"]
    assert served(settings) == {"asr": ["en"], "tts": ["en_US"], "handle": ["en"]}


def test_a_chinese_household_in_one_option(tmp_path) -> None:
    settings = server_settings(
        "--language", "zh", "--asr-model", "base", "--data-dir", str(tmp_path)
    )
    assert settings.asr.language == "zh"
    assert settings.tts.voice == "zh_CN-huayan-medium"  # the embedded voice speaks English
    assert settings.llm.system_prompt == SYSTEM_PROMPTS["zh"] and "中文" in SYSTEM_PROMPTS["zh"]
    # Described from the names: nothing is downloaded to answer describe.
    assert served(settings) == {"asr": ["zh"], "tts": ["zh_CN"], "handle": ["zh"]}
    assert not any(tmp_path.iterdir())


def test_explicit_options_win_over_the_language(tmp_path) -> None:
    settings = server_settings(
        "--language", "zh", "--asr-language", "auto", "--voice", "/x/v.onnx",
        "--system-prompt", "Be brief.", "--llm-language", "zh", "--llm-language", "en",
    )  # fmt: skip
    assert settings.asr.language is None  # auto: detected per request
    assert settings.tts.voice == "/x/v.onnx" and settings.llm.system_prompt == "Be brief."
    assert settings.llm.languages == ("zh", "en")


@pytest.mark.parametrize("language", ["de", "ja"])
def test_other_languages_get_their_prompt(language: str) -> None:
    settings = server_settings("--language", language)
    assert settings.llm.system_prompt == SYSTEM_PROMPTS[language]


def test_an_english_only_asr_serves_english_whatever_was_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = server_settings("--language", "zh", "--voice", "embedded")
    assert served(settings)["asr"] == ["en"]  # tiny.en cannot hear Chinese: say so
    assert "English-only" in caplog.text and "--asr-model base" in caplog.text

"""Settings spelled once: a settings field carries its flag, help and add-on option.

    beam_size: int = opt(1, "--asr-beam-size", help="…", addon=Addon("int(1,10)"))
    asr: AsrSettings = nest(AsrSettings, group="speech to text (faster-whisper)")

`add_arguments` builds the argparse options of a settings class (nested ones in their
groups, in field order), `build` turns the parsed args back into it, and `addon.py` maps
the add-on's /data/options.json onto the same flags. A flag's default is the field's
unless it says otherwise (`cli_default`: e.g. None where "not given" cascades from
another option). Stdlib only: the satellite's `--help` imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass
from typing import Any, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # not given (dataclasses' MISSING would make the field required)

_FLAG = "pivoice.flag"
_NEST = "pivoice.nest"


@dataclass(frozen=True)
class Addon:
    """The add-on's option for a flag: its Supervisor schema type, e.g. "int(1,10)" or "str?"
    (a "?": optional, absent from `options:` unless it has a `default` there)."""

    schema: str
    key: str | None = None  # default: the flag's name, "--asr-model" → "asr_model"
    default: Any = UNSET  # the add-on's default, when not the flag's


@dataclass(frozen=True)
class Flag:
    flag: str
    help: str | None = None
    type: Callable[[str], Any] | None = None  # default: the field default's type (str if None)
    choices: Sequence[Any] | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | None = None
    append: bool = False  # repeatable; the field gets a tuple
    cli_default: Any = UNSET  # the flag's default, when not the field's
    env: str | None = None  # the flag's default from this variable, read when the CLI is built
    convert: Callable[[Any], Any] | None = None  # parsed value → field value
    reads: str | None = None  # no flag of its own: another field's flag (its dest) feeds it
    group: str | None = None  # argparse group title (default: the nesting field's)
    exclusive: str | None = None  # fields with the same name here: one of them at most
    addon: Addon | None = None

    @property
    def dest(self) -> str:
        return self.reads or self.flag.removeprefix("--").replace("-", "_")

    def addon_key(self) -> str:
        assert self.addon is not None
        return self.addon.key or self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Nest:
    cls: type
    group: str | None = None
    optional: bool = False  # None unless the command line asks for it (cli.py builds it)


def opt(
    default: Any = MISSING,
    flag: str = "",
    *,
    default_factory: Callable[[], Any] | Any = MISSING,
    **kwargs: Any,
) -> Any:
    """A settings field with its flag (`Flag`'s fields as keywords)."""
    spec = Flag(flag, **kwargs)
    assert flag or spec.reads, "a field with a flag needs its name"
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={_FLAG: spec})
    return dataclasses.field(default=default, metadata={_FLAG: spec})


def nest(cls: type, *, group: str | None = None, optional: bool = False) -> Any:
    """A field holding another settings class whose fields carry flags."""
    spec = Nest(cls, group, optional)
    if optional:
        return dataclasses.field(default=None, metadata={_NEST: spec})
    return dataclasses.field(default_factory=cls, metadata={_NEST: spec})


def flag_of(field: dataclasses.Field[Any]) -> Flag | None:
    spec = field.metadata.get(_FLAG)
    return spec if isinstance(spec, Flag) else None


def nest_of(field: dataclasses.Field[Any]) -> Nest | None:
    spec = field.metadata.get(_NEST)
    return spec if isinstance(spec, Nest) else None


def field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return None  # a required field: its flag is optional, cli.py checks the pair


def flag_default(field: dataclasses.Field[Any], spec: Flag) -> Any:
    if spec.env is not None and spec.env in os.environ:
        return os.environ[spec.env]
    if spec.cli_default is not UNSET:
        return spec.cli_default
    default = field_default(field)
    if spec.append:
        return list(default or ())
    if _switch(field, spec):
        return False
    return default


def _switch(field: dataclasses.Field[Any], spec: Flag) -> bool:
    """A bool field is a switch: `--x` sets it, `--no-x` clears a default True."""
    return isinstance(field.default, bool) and spec.choices is None and spec.type is None


def _inverted(field: dataclasses.Field[Any], spec: Flag) -> bool:
    return _switch(field, spec) and field.default is True


def walk(
    cls: type, group: str | None = None
) -> Iterator[tuple[dataclasses.Field[Any], Flag, str | None]]:
    """Every flagged field of `cls` and its nested classes, in field order, with its group."""
    for field in dataclasses.fields(cls):
        spec, inner = flag_of(field), nest_of(field)
        if spec is not None:
            yield field, spec, spec.group or group
        elif inner is not None:
            yield from walk(inner.cls, inner.group or group)


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    only: Sequence[str] | None = None,
    group: str | None = None,
) -> None:
    """`cls`'s flags on `parser`, each in its group (made on first use, so in field order);
    `only`: just these flags, and `group`: all in this one (another command that takes some
    of the same settings, e.g. the doctor)."""
    groups: dict[str | None, Any] = {None: parser}
    for existing in parser._action_groups:  # titles a caller made first keep their place
        groups.setdefault(existing.title, existing)
    exclusive: dict[tuple[str | None, str], Any] = {}
    for field, spec, title in walk(cls):
        title = group or title
        if spec.reads or (only is not None and spec.flag not in only):
            continue
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        into = groups[title]
        if spec.exclusive:
            key = (title, spec.exclusive)
            if key not in exclusive:
                exclusive[key] = into.add_mutually_exclusive_group()
            into = exclusive[key]
        assert not _inverted(field, spec) or spec.flag.startswith("--no-"), spec.flag
        kwargs: dict[str, Any] = {"default": flag_default(field, spec), "help": spec.help}
        if _switch(field, spec):
            kwargs["action"] = "store_true"
        else:
            if spec.append:
                kwargs["action"] = "append"
            kind = spec.type
            if kind is None and not spec.choices:
                default = field_default(field)
                kind = type(default) if isinstance(default, (int, float)) else None
            if kind is not None:
                kwargs["type"] = kind
            for name in ("choices", "metavar", "nargs"):
                if getattr(spec, name) is not None:
                    kwargs[name] = getattr(spec, name)
        into.add_argument(spec.flag, **kwargs)


def values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """`cls`'s own flagged fields as given on the command line (nested classes: `build`)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        spec = flag_of(field)
        if spec is None or not hasattr(args, spec.dest):
            continue
        value = getattr(args, spec.dest)
        if _inverted(field, spec):
            value = not value
        if spec.append:
            value = tuple(value) if value is not None else None
        if spec.convert is not None:
            value = spec.convert(value)
        if value is None and spec.append:
            continue  # not given: the field's default
        out[field.name] = value
    return out


def build(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """`cls` from the parsed args: its flags, its nested classes (an optional one only from
    `overrides`), then `overrides`."""
    kwargs = values(cls, args)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        inner = nest_of(field)
        if inner is not None and not inner.optional and field.name not in overrides:
            kwargs[field.name] = build(inner.cls, args)
    kwargs.update(overrides)
    return cls(**kwargs)


# The values of the URI flags: argparse types, so a URI without its scheme is refused at once.
def _uri(value: str, schemes: tuple[str, ...], example: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in schemes:
        hint = f"tcp://{value}" if ":" in value and "://" not in value else example
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a Wyoming URI ({', '.join(s + '://' for s in schemes)}): "
            f"write e.g. {hint}"
        )
    if parsed.scheme == "tcp":
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None:
            raise argparse.ArgumentTypeError(f"{value!r} needs a host and a port, e.g. {example}")
    if parsed.scheme == "unix" and not (parsed.netloc + parsed.path):
        raise argparse.ArgumentTypeError(f"{value!r} needs a path, e.g. unix:///run/pivoice.sock")
    return value


def server_uri(value: str) -> str:
    """argparse type of a --uri to listen on: tcp://HOST:PORT, unix://PATH or stdio://."""
    return _uri(value, ("tcp", "unix", "stdio"), "tcp://0.0.0.0:10800")


def client_uri(value: str) -> str:
    """argparse type of a server to connect to: tcp://HOST:PORT or unix://PATH."""
    return _uri(value, ("tcp", "unix"), "tcp://127.0.0.1:10800")

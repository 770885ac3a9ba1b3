"""A setting, declared once: its name, type, default, allowed values or bounds,
help, and which frameworks read it.

Everything else is derived from the declaration, so nothing can drift apart:
the `trainscale train/run` flag (cli.py), the check of a value with its
one-line message (settings.validate), the RunSettings field and its default
(settings.py), and the study config schema's fragments for it: the
`benchmark:` key, the grid's knob axis and the constraint clause's axis
(schema.config_schema). ReFrame's typed `variable(...)` with its doc comment
is the model.

Where a setting is declared says who reads it: the settings every framework
reads are declared in trainscale.catalogue.settings; a knob only some frameworks read
is declared in their registry entries (trainscale.catalogue.registry), or on the
launch kind that reads it (trainscale.catalogue.launch_kinds). Imports nothing of
trainscale, so all three can use it.
"""

from __future__ import annotations

from argparse import SUPPRESS
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable


class SettingsError(ValueError):
    """A setting is invalid; the message names the option and fits on one line."""


# The default of a setting that has none: it must be given (--framework).
REQUIRED = object()


@dataclass(frozen=True)
class Setting:
    name: str
    type: type  # bool, int, float or str
    default: Any  # or REQUIRED
    help: str
    # Allowed values (empty: any value of the type within the bounds).
    choices: tuple[Any, ...] = ()
    # Inclusive lower bound, or exclusive with `exclusive_minimum`.
    minimum: float | None = None
    exclusive_minimum: bool = False
    # Who reads it, for settings declared in trainscale.catalogue.settings: None for
    # every framework, else framework or ecosystem names ("torch"). A knob
    # declared in registry entries is read by exactly those frameworks.
    readers: tuple[str, ...] | None = None
    # A knob: a study's grid may vary it (`grid.<name>: [...]`), one record
    # folder per value.
    axis: bool = False
    # A `benchmark:` key of a study config (False: the grid or the command line sets it).
    in_study: bool = True
    group: str = "training"  # its section of `trainscale train --help`
    metavar: str | None = None
    # A regular expression a study config's value must match (a path a shell
    # command line carries); the command line takes any value.
    pattern: str | None = None
    # A check against the other settings: settings -> "" or the one-line message.
    check: Callable[[Any], str] | None = None
    # The command-line flag where --NAME cannot be it (None: --NAME).
    cli_flag: str | None = None
    # Names it had before (records, study configs and command lines written
    # with them stay readable: renamed(), and a hidden flag each).
    former_names: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return self.cli_flag or "--" + self.name.replace("_", "-")

    def value_in(self, settings: Mapping) -> Any:
        """Its value in `settings` (a record's, a run's knobs), else its default."""
        return settings.get(self.name, self.default)

    def cli_text(self, value) -> str:
        """The value as `trainscale train` reads it back."""
        return str(value)

    def validate(self, value) -> None:
        """Raise SettingsError, naming the flag, unless `value` is allowed."""
        if self.choices and value not in self.choices:
            choices = ", ".join(str(c) for c in self.choices)
            raise SettingsError(f"{self.flag} {value!r} is unknown; choose one of {choices}")
        if self.minimum is None or value is None:
            return
        if self.exclusive_minimum and not value > self.minimum:
            above = "positive" if self.minimum == 0 else f"above {self.minimum:g}"
            raise SettingsError(f"{self.flag} must be {above}, got {value}")
        if not self.exclusive_minimum and not value >= self.minimum:
            raise SettingsError(f"{self.flag} must be {self._bound_words()}, got {value}")

    def _bound_words(self) -> str:
        if self.minimum == 0:
            return "zero or positive"
        if self.minimum == 1 and self.type is int:
            return "a positive integer"
        return f"at least {self.minimum:g}"

    def schema(self) -> dict:
        """The JSON schema of one value (a study config's grid axis item)."""
        schema: dict = {
            bool: {"type": "boolean"},
            int: {"type": "integer"},
            float: {"type": "number"},
            str: {"type": "string"},
        }[self.type]
        if self.choices:
            schema = {"enum": list(self.choices)}
        if self.minimum is not None:
            schema["exclusiveMinimum" if self.exclusive_minimum else "minimum"] = self.minimum
        if self.pattern:
            schema["pattern"] = self.pattern
        return schema

    def from_text(self, text: str):
        """A value as it appears in a record's path ('true', '64', 'fp16') in its type."""
        if self.type is bool:
            return text == "true"
        return self.type(text)

    def coerce(self, value):
        """A value from YAML in the declared type (YAML's 64 for a float setting is 64.0)."""
        return float(value) if self.type is float and not isinstance(value, bool) else value


def add_argument(group, setting: Setting, default=None) -> None:
    """`setting`'s flag, as its declaration says (trainscale.core.setting); a bool is
    --NAME / --no-NAME, as argparse.BooleanOptionalAction (Python 3.9+) makes
    them, written out because the harness also runs on Python 3.8 (NVIDIA 23.03)."""
    default = setting.default if default is None else default
    if setting.type is bool:
        state = "on" if default else "off"
        help_text = f"{setting.help} (default: {state}; --no-{setting.flag[2:]} turns it off)"
        group.add_argument(
            setting.flag, dest=setting.name, action="store_true", default=default, help=help_text
        )
        group.add_argument(
            "--no-" + setting.flag[2:], dest=setting.name, action="store_false", help=SUPPRESS
        )
        return
    for former in setting.former_names:
        # default=SUPPRESS: the former flag sets the value only when given
        # (its own default would replace the setting's).
        flag = "--" + former.replace("_", "-")
        group.add_argument(
            flag, dest=setting.name, type=setting.type, default=SUPPRESS, help=SUPPRESS
        )
    required = default is REQUIRED
    choices = f"; one of {', '.join(str(c) for c in setting.choices)}" if setting.choices else ""
    shown = "" if required or default is None else " (default: %(default)s)"
    group.add_argument(
        setting.flag,
        dest=setting.name,
        type=setting.type,
        required=required,
        default=None if required else default,
        metavar=setting.metavar,
        help=f"{setting.help}{choices}{shown}",
    )


def renamed(values: dict, settings) -> dict:
    """`values` (a record's settings, a study's benchmark:) with each of
    `settings`' former names under its current one (a current name given too wins)."""
    values = dict(values)
    for setting in settings:
        for former in setting.former_names:
            if former in values:
                old = values.pop(former)
                values.setdefault(setting.name, old)
    return values

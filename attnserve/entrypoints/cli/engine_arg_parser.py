"""``EngineArgumentParser``: the ``attnserve`` command's argument parser, with one-line errors (exit status 2),
``_`` and ``-`` alike in flag names, no abbreviations, a value given to a flag that takes none refused by name,
and, once engine args are added (``engine_args.add_engine_args``), unknown flags named with a suggestion."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn, Sequence

from attnserve.config import AttentionConfig, ConfigError
from attnserve.refusals import closest, message
from attnserve.refusals.cli import no_value, unrecognized_arguments

_ATTENTION_DOTTED = ("--attention-config.", "-ac.")
# after a flag that takes no value, these are a value meant for it, not the positional MODEL
_BOOL_WORDS = {"true", "false", "yes", "no", "0", "1", "on", "off"}


def _is_flag(arg: str) -> bool:
    """``--json``, ``-x``; not ``-`` or a negative number (``-1``), which argparse reads as values."""
    return arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit() and arg[1] != "."


def _norm(flag: str) -> str:
    return flag.replace("_", "-")


def _dotted_prefix(flag: str) -> str | None:
    """The attention-config dotted prefix ``flag`` starts with (``-ac.``, ``--attention-config.``), or None."""
    return next((p for p in _ATTENTION_DOTTED if _norm(flag).startswith(p)), None)


class EngineArgumentParser(argparse.ArgumentParser):
    """ArgumentParser with one-line errors (exit 2), ``_``/``-`` interchangeable in flag names, no
    abbreviations, and, once engine args are added, unknown flags named with a suggestion."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a prefix of a flag silently meaning that flag is a trap
        super().__init__(*args, **kwargs)
        self.has_engine_args = False

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.splitlines())}\n")

    def _canonical_flags(self, arg_strings: Sequence[str]) -> list[str]:
        """``arg_strings`` with each flag in its parser spelling (``--block_size`` -> ``--block-size``); how each
        occurrence was written is kept in order per flag (``written``), for :meth:`written_as`."""
        by_norm = {_norm(o): o for o in self._option_string_actions}
        self.written: dict[str, list[str]] = {}
        out, rest = [], list(arg_strings)
        while rest:
            arg = rest.pop(0)
            if arg == "--":
                out += [arg, *rest]
                break
            if arg.startswith("-"):
                name, eq, value = arg.partition("=")
                canonical = name if name in self._option_string_actions else by_norm.get(_norm(name), name)
                if canonical in self._option_string_actions:
                    self.written.setdefault(canonical, []).append(name)
                arg = canonical + eq + value
            out.append(arg)
        return out

    def written_as(self, option_string: str | None) -> str | None:
        """How the user wrote the next occurrence of ``option_string`` (taken from :meth:`_canonical_flags`' record),
        or None where not recorded."""
        occurrences = getattr(self, "written", {}).get(option_string or "")
        return occurrences.pop(0) if occurrences else None

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):  # type: ignore[override]
        arg_strings = self._canonical_flags(sys.argv[1:] if args is None else list(args))
        self._refuse_flag_values(arg_strings)
        ns, extras = super().parse_known_args(arg_strings, namespace)
        if extras:
            self._refuse_flag_values(arg_strings, extras)
        if extras and self.has_engine_args:
            self._unrecognized(extras)
        if extras and "-ac" in self._option_string_actions:  # -ac of its own (bench attention): JSON only
            self._dotted_attention_config(extras)
        return ns, extras

    def _dotted_attention_config(self, extras: list[str]) -> None:
        """Refuse ``-ac.FIELD VALUE`` where ``-ac`` takes only a JSON object, saying which form is taken (argparse
        would say "unrecognized arguments")."""
        for extra in extras:
            flag = extra.partition("=")[0]
            if (prefix := _dotted_prefix(flag)) is not None:
                field = flag[len(prefix) :]
                self.error(
                    f"argument {flag}: the dotted form is not taken here; give -ac a JSON object "
                    f"(-ac '{{\"{field}\": VALUE}}')"
                )

    def _refuse_flag_values(self, arg_strings: list[str], extras: list[str] | None = None) -> None:
        """A flag that takes no value given one: ``--enforce-eager=maybe`` or, when ``maybe`` was left over
        (``extras``), ``--enforce-eager maybe``; with a positional MODEL, also ``--enforce-eager false``
        (a true/false word would otherwise be taken as the model). One line naming the value and the
        allowed forms, instead of argparse's "ignored explicit argument" / "unrecognized arguments"."""
        subcommands = {n for a in self._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices}
        positional_model = any(a.dest == "model_tag" for a in self._actions)
        previous = None
        for arg in arg_strings:
            if arg == "--" or arg in subcommands:  # the rest is positional, or a subcommand's to check
                return
            flag, eq, value = arg.partition("=")
            if eq and arg.startswith("-"):
                self._no_value(flag, value)
            elif (
                previous is not None
                and not _is_flag(arg)  # an unknown flag is no value: _unrecognized names it
                and (extras and arg in extras or positional_model and arg.lower() in _BOOL_WORDS)
            ):
                self._no_value(previous, arg)
            previous = arg
        return

    def _no_value(self, flag: str, value: str) -> None:
        action = self._option_string_actions.get(flag)
        if action is not None and action.nargs == 0:
            forms = " or ".join(action.option_strings)
            self.error(message(no_value(flag, value, forms)))

    def _unrecognized(self, extras: list[str]) -> NoReturn:
        flag = next((e.partition("=")[0] for e in extras if e.startswith("-")), None)
        if flag and (prefix := _dotted_prefix(flag)) is not None:
            try:
                AttentionConfig.normalize_key(flag[len(prefix) :], f"in {flag}")
            except ConfigError as e:
                self.error(message(e.refusal.at(f"argument {flag}", written=e.refusal.written)))
        near = closest(_norm(flag), list(self._option_string_actions)) if flag else None
        self.error(unrecognized_arguments(extras, near))

"""Reading a config file: at most 64 KiB of UTF-8, YAML without aliases or deep nesting.

What comes out is a plain tree for ``config.parse_config`` to validate. Every way a file can
be refused here is one ConfigError line naming the file (and the line, for YAML), found
cheaply: the supervisor reads the file in its main loop on SIGHUP.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, quote

# A config is a few kilobytes. Each worker child receives the file's text in one environment
# variable, which Linux caps at 128 KiB; and 64 KiB of the costliest YAML still parses in
# well under a second, so a SIGHUP never holds the main loop (and the watchdog) for long.
MAX_CONFIG_BYTES = 64 * 1024
# The deepest key path is five levels (pools.<name>.task_types[i]); far past that is a file
# built to make the recursive YAML composer overflow the stack.
MAX_YAML_DEPTH = 20


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases and deep nesting, and turning the values its
    constructors cannot build into YAML errors that name the line.

    An alias (``*name``) repeats an anchored node by reference, so a few lines of anchors that
    refer to anchors ("billion laughs") stand for billions of values: cheap to load, ruinous
    to walk or to quote in a problem line. A config has nothing to repeat that is worth that
    risk, and refusing every alias is simpler to trust than a limit on them: a small count of
    aliases still doubles the expanded size at each level.
    """

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._refuse("aliases (*name) are not allowed in a pgtaskd config; "
                         "write the value out")
        if self.depth >= MAX_YAML_DEPTH:
            self._refuse(f"nested more than {MAX_YAML_DEPTH} levels deep")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def _refuse(self, problem: str):
        raise yaml.composer.ComposerError(None, None, problem, self.peek_event().start_mark)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:  # int() past its digit limit, a 13th month
            raise yaml.constructor.ConstructorError(None, None, _unbuildable(node, exc),
                                                    node.start_mark) from None


def _unbuildable(node: yaml.Node, exc: Exception) -> str:
    kind = node.tag.rpartition(":")[2]
    if kind == "int" and len(node.value) > sys.get_int_max_str_digits():
        return (f"an integer of {len(node.value)} digits is longer than Python reads "
                f"({sys.get_int_max_str_digits()} at most)")
    return f"cannot read {quote(node.value)} as a {kind}: {str(exc).split(';')[0]}"


def read_config_text(path: Path) -> str:
    """The file's text, or ConfigError without reading more than the size limit."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    check_size(path, len(data))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise ConfigError(f"{path}: not UTF-8 text: byte 0x{data[exc.start]:02x} at line "
                          f"{line}, column {column}") from None


def check_size(path: Path, size: int) -> None:
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file is larger than {MAX_CONFIG_BYTES // 1024} KiB")


def parse_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {reason}") from None

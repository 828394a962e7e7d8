"""YAML and JSON input, bounded: a mapping, or one clear line naming where the text came from.

Input files may be hostile: a 500-byte alias bomb expands to billions of nodes, 100,000
levels of nesting overflow PyYAML's recursive composer, a device file never ends. So a
file is read only when it is a regular file of bounded size, and its event stream (PyYAML's
parser is iterative) is measured before anything is built: nesting depth, and the node
count with every alias expanded.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from .. import defaults as D
from ..errors import InputError

# libyaml's loader where PyYAML was built with it; the bounds below apply to either.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(path: Path | str, what: str = "") -> str:
    """The UTF-8 text of a regular file of at most MAX_CONFIG_BYTES."""
    if isinstance(path, str) and not path.strip():  # Path("") would read as the folder "."
        raise InputError("an empty file name was given (\"\"); name a file")
    name = what or str(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{name}: not a regular file")
    if st.st_size > D.MAX_CONFIG_BYTES:
        raise InputError(f"{name}: {st.st_size} bytes, more than the {D.MAX_CONFIG_BYTES} a stage config may have")
    try:
        with open(path, "rb") as f:
            data = f.read(D.MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > D.MAX_CONFIG_BYTES:
        raise InputError(f"{name}: more than the {D.MAX_CONFIG_BYTES} bytes a stage config may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def _events(text: str):
    """The event stream, stopped once it nests deeper than MAX_YAML_DEPTH (so a deep file is
    refused by the same count, whichever parser reads it)."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > D.MAX_YAML_DEPTH:
                yield event
                return
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        yield event


def _measure(text: str, where: str, error: type[InputError]) -> None:
    """Refuse text whose nesting or alias-expanded size exceeds the limits."""
    sizes: dict[str, int] = {}
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, node count when it opened)
    count = 0
    try:
        events = list(_events(text))
    except yaml.YAMLError as exc:  # libyaml stops at 1000 levels itself, before our count sees them
        if "nesting depth" in str(getattr(exc, "problem", "")):
            raise error(f"{where}: nested deeper than {D.MAX_YAML_DEPTH} levels") from None
        raise
    for event in events:
        if isinstance(event, yaml.AliasEvent):
            count += sizes.get(event.anchor, 1)
        elif isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            count += 1
            if isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            else:
                open_nodes.append((event.anchor, count))
                if len(open_nodes) > D.MAX_YAML_DEPTH:
                    raise error(f"{where}: nested deeper than {D.MAX_YAML_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, start = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = count - start + 1
        if count > D.MAX_YAML_NODES:
            raise error(f"{where}: more than {D.MAX_YAML_NODES} YAML nodes once aliases are expanded")


def _one_line(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{problem}{where}"


def parse_mapping(text: str, where: str, error: type[InputError] = InputError) -> dict:
    try:
        _measure(text, where, error)
        data = yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader: SafeLoader or CSafeLoader)
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply") from None
    if not isinstance(data, dict):
        raise error(f"{where}: expected a mapping at the top level")
    return data


def parse_json(text: str, where: str):
    """A JSON value, or InputError: invalid JSON, nesting Python's decoder cannot follow
    (it recurses), and the NaN and Infinity literals JSON does not have."""
    import json

    def no_constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from None

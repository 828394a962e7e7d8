"""YAML text -> a mapping, or one clear error naming where the text came from."""

from __future__ import annotations

import yaml

from .errors import InputError


def parse_mapping(text: str, where: str, error: type[InputError] = InputError) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{where}: expected a mapping at the top level")
    return data

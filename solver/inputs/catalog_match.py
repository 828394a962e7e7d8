"""Which catalog pipeline a checkpoint's config.json is: each catalog entry's `match` rules,
as data, and the one matcher model_source.py reads them with.

A rule names a config.json `model_type`, or one of its `architectures` for a checkpoint whose
model_type names a plain LLM (tried only where no rule names the model_type), and may add
conditions on other config values, given as dotted paths. Among the rules of one model_type, those with conditions are tried first; a rule
without any is the model_type's default, chosen when no rule with conditions holds. A rule
with `refuse` names a pipeline whose checkpoint is not read yet: its config is refused with
the reason and pointed to the catalog name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from ..errors import CatalogError, InputError
from .catalog_parts import Strict
from .hfconfig import optional_mapping


class Condition(Strict):
    """A test on one value of config.json; a rule holds when all of its conditions do."""

    key: str | list[str] = Field(
        description="A dotted path into config.json (talker_config.hidden_size); a list: the first of these "
        "paths the config holds (thinker_config.text_config.hidden_size, then thinker_config.hidden_size). "
        "An object on the way that is absent or null reads as empty; one that is no object is an error.")
    equals: Any = Field(default=None, description="The value it must equal (as Python's == compares); a "
                        "condition sets equals or truthy.")
    truthy: bool | None = Field(
        default=None, description="Instead of equals: whether the value must read as true or as false (false, 0, "
        "empty and null are false), as vLLM-Omni's `if not hf_config.enable_audio_output` reads it.")
    default: Any = Field(default=None, description="The value when the config holds none of the paths "
                         "(the config class's default; null when not given).")

    @model_validator(mode="before")
    @classmethod
    def _one_test(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("equals" not in data if data.get("truthy") is None
                                       else data.get("equals") is not None):
            raise ValueError("a condition sets one of equals and truthy")
        return data

    @model_validator(mode="after")
    def _paths(self) -> "Condition":
        paths = [self.key] if isinstance(self.key, str) else self.key
        if not paths or any(not p or any(not part for part in p.split(".")) for p in paths):
            raise ValueError(f"key {self.key!r}: dotted paths of config.json keys")
        return self

    def holds(self, cfg: dict) -> bool:
        for path in [self.key] if isinstance(self.key, str) else self.key:
            held, value = _lookup(cfg, path)
            if held:
                break
        else:
            value = self.default
        return bool(value) == self.truthy if self.truthy is not None else value == self.equals


def _lookup(cfg: dict, path: str) -> tuple[bool, Any]:
    """(whether the config holds the path, its value); an object on the way that is no object
    is an InputError naming it."""
    *parents, last = path.split(".")
    node, where = cfg, "config.json"
    for part in parents:
        node = optional_mapping(node, part, where)
        where = f"{where} {part}"
    return last in node, node.get(last)


class MatchRule(Strict):
    """How a checkpoint's config.json is recognised as this catalog entry."""

    model_type: str | None = Field(default=None, description="config.json model_type.")
    architecture: str | None = Field(
        default=None, description="Instead of model_type: one of config.json architectures, for a checkpoint "
        "whose model_type names a plain LLM (MiMo-Audio's is qwen2); tried where no rule names the model_type.")
    when: list[Condition] = Field(
        default_factory=list, description="Conditions that must all hold, tried in order. A rule without any is "
        "the default of its model_type (or architecture): it holds when no rule of it with conditions does.")
    refuse: str | None = Field(
        default=None, description="Set (why): this checkpoint is not read yet; a config the rule matches is "
        "refused with this reason and pointed to --model NAME (the pipeline itself is still planned by name).")
    source: str | None = Field(default=None, description="Where vLLM-Omni resolves such a checkpoint to this "
                               "pipeline, where registry_key's source does not say it.")

    @model_validator(mode="after")
    def _one_key(self) -> "MatchRule":
        if (self.model_type is None) == (self.architecture is None):
            raise ValueError("a match rule names one of model_type and architecture")
        return self

    @property
    def names(self) -> tuple[str, str]:
        """(the config field it reads, the value it names)."""
        return ("model_type", self.model_type) if self.model_type is not None else ("architecture", self.architecture)


@dataclass(frozen=True)
class Matched:
    name: str  # the catalog entry
    rule: MatchRule

    def refusal(self, reference: str) -> InputError:
        """The pointer for a checkpoint this rule refuses."""
        field, value = self.rule.names
        what = f"{value} directory" if field == "model_type" else f"{value} checkpoint"
        return InputError(f"{reference}: a {what} is not read yet ({self.rule.refuse}); plan it by its catalog "
                          f"name: --model {self.name}")


def _rules(catalog: Mapping[str, Any], field: str, value: str) -> list[Matched]:
    return [Matched(name, rule) for name, spec in catalog.items() for rule in spec.match
            if rule.names == (field, value)]


def names_model_type(catalog: Mapping[str, Any], model_type: object) -> bool:
    """Whether some catalog rule names this model_type."""
    return isinstance(model_type, str) and bool(_rules(catalog, "model_type", model_type))


def match_config(catalog: Mapping[str, Any], cfg: dict, reference: str) -> Matched | None:
    """The catalog rule a config.json matches: its model_type's rules, or where no rule names
    its model_type, each of its architectures' in order; None: none holds. Two entries' rules
    holding at once is an InputError (a config the catalog cannot tell apart)."""
    model_type, archs = cfg.get("model_type"), cfg.get("architectures")
    if names_model_type(catalog, model_type):
        keys = [("model_type", model_type)]
    else:
        keys = [("architecture", a) for a in (archs if isinstance(archs, list) else []) if isinstance(a, str)]
    for field, value in keys:
        rules = _rules(catalog, field, value)
        held = [m for m in rules if m.rule.when and all(c.holds(cfg) for c in m.rule.when)]
        held = held or [m for m in rules if not m.rule.when]
        names = sorted({m.name for m in held})
        if len(names) > 1:
            raise InputError(f"{reference}: config.json {field} {value!r} matches more than one catalog pipeline "
                             f"({', '.join(names)}); plan it by its catalog name: --model {names[0]}")
        if held:
            return held[0]
    return None


def check_rules(catalog: Mapping[str, Any]) -> None:
    """Rules no config can tell apart: two defaults (no conditions) of one model_type or
    architecture, or two rules with the same conditions."""
    seen: dict[tuple, str] = {}
    for name, spec in catalog.items():
        for rule in spec.match:
            key = (rule.names, tuple(c.model_dump_json() for c in rule.when))
            if key in seen:
                field, value = rule.names
                raise CatalogError(f"{name}: match: {field} {value!r} with the same conditions as in {seen[key]}: "
                                   "a config of it would match both")
            seen[key] = name

"""The field reference of docs/catalog.md, generated from the catalog's pydantic models: every
model a catalog file can hold, reached from PipelineSpec, with each field's type, constraints,
default and description. tests/test_catalog_guide.py fails when the page's copy is stale.

    python -m omni_autoconf.inputs.catalog_guide                           # print the reference
    python -m omni_autoconf.inputs.catalog_guide --write docs/catalog.md   # rewrite its section
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .catalog import PipelineSpec

START, END = "<!-- fields:start -->", "<!-- fields:end -->"
COMMAND = "python -m omni_autoconf.inputs.catalog_guide --write docs/catalog.md"


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def catalog_models(root: type[BaseModel]) -> list[tuple[type[BaseModel], str]]:
    """(model, the YAML path where it first appears), depth first in field order."""
    out: list[tuple[type[BaseModel], str]] = []

    def visit(model: type[BaseModel], where: str) -> None:
        if any(model is m for m, _ in out):
            return
        out.append((model, where))
        for name, field in model.model_fields.items():
            origin = typing.get_origin(field.annotation)
            suffix = "[]" if origin is list else ".KEY" if origin is dict else ""
            for nested in _models_in(field.annotation):
                visit(nested, f"{where}.{name}{suffix}".lstrip("."))

    visit(root, "")
    return out


def _type(annotation) -> str:
    """A field's type in words (a nested model by its name: its section follows)."""
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"`{annotation.__name__}`"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return "mapping" if args[1] is typing.Any else f"mapping of {_type(args[0])} to {_type(args[1])}"
    return {str: "string", int: "integer", float: "number", bool: "boolean", typing.Any: "any"}.get(
        annotation, getattr(annotation, "__name__", str(annotation)))


def _constraints(field) -> list[str]:
    words = (("gt", "> {}"), ("ge", ">= {}"), ("lt", "< {}"), ("le", "<= {}"), ("min_length", "length >= {}"),
             ("max_length", "length <= {}"), ("pattern", "pattern `{}`"))
    out = [text.format(getattr(item, attr)) for item in field.metadata for attr, text in words
           if getattr(item, attr, None) is not None]
    return ["not empty" if c == "length >= 1" else c for c in out]


def _default(field) -> str:
    if field.default_factory is not None:
        return f"`{json.dumps(field.default_factory())}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{json.dumps(field.default)}`"


def _wrap(text: str) -> str:
    return textwrap.fill(re.sub(r"\s+", " ", text).strip(), 100, break_long_words=False, break_on_hyphens=False)


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def catalog_guide_reference() -> str:
    """The generated field reference (markdown): one section per catalog model."""
    parts = [_wrap("The fields of a catalog file, generated from the pydantic models in solver/inputs/ "
                   "(catalog.py, catalog_stage.py, catalog_parts.py, catalog_match.py); unknown keys are errors.")]
    for model, where in catalog_models(PipelineSpec):
        doc = (model.__doc__ or "").strip().split("\n\n")[0]
        at = "the top level of the file" if not where else f"`{where}`"
        parts.append(f"### {model.__name__}\n\n{_wrap(f'{doc} At {at}.')}\n\n"
                     "| field | type | default | description |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            kind = ", ".join([_type(field.annotation), *_constraints(field)])
            parts[-1] += f"\n| `{name}` | {_cell(kind)} | {_default(field)} | {_cell(field.description or '')} |"
    return "\n\n".join(parts) + "\n"


def with_reference(page: str) -> str:
    """The page with its generated section (between START and END) replaced by the current one."""
    head, found, rest = page.partition(START + "\n")
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise ValueError(f"the page has no {START} ... {END} section")
    return f"{head}{START}\n{catalog_guide_reference()}{END}{tail}"


def main(argv: list[str]) -> int:
    if not argv:
        sys.stdout.write(catalog_guide_reference())
        return 0
    if len(argv) == 2 and argv[0] == "--write":
        path = Path(argv[1])
        path.write_text(with_reference(path.read_text()))
        return 0
    sys.stderr.write("usage: python -m omni_autoconf.inputs.catalog_guide [--write PAGE]\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

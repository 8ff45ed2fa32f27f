"""The recipe: one YAML file per model and task, read, overridden and validated once, at the door, into
one frozen, fully resolved `Recipe` that the CLI hands to the flow and every stage reads.

- `schema.py`: the sections (pydantic, `extra="forbid"`, frozen); `sft:`/`grpo:` against TRL's dataclasses.
- `defaults.py`: where TRL values come from (the recipe, Regimen's short list with reasons, or TRL).
- here: reading YAML, `--set` overrides, error messages that name the field and line, and `explain`
  (what `regimen check` prints: every value with where it came from).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from regimen.stages.core.errors import InputError
from regimen.stages.recipe import defaults, trl
from regimen.stages.recipe.schema import Recipe, RewardSpec
from regimen.stages.tasks.registry import TASKS

__all__ = [
    "Recipe",
    "RewardSpec",
    "load_recipe",
    "recipe_from_dict",
    "parse_set",
    "apply_overrides",
    "read_yaml",
    "load_yaml",
    "explain",
    "raw_of",
]

_YAML11_WORDS = {"yes", "no", "on", "off", "y", "n"}
_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")
# a recipe's values once its aliases are expanded (a shipped recipe holds a few hundred), and how deep they nest
_MAX_NODES = 200_000
_MAX_DEPTH = 64


class _Loader(yaml.SafeLoader):
    """YAML as a recipe is read: PyYAML's safe loader, with a key written twice in one mapping refused (the safe
    loader keeps the last silently, so a second `sft:` section dropped the whole first one) and dates left as
    strings (a recipe has no date field; `experiment: 2024-13-45` raised from inside the date constructor).
    PyYAML has no switch for either; this subclass overrides only its documented `construct_mapping`."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the safe loader names it itself
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is written twice in one mapping", key_node.start_mark
                    )
        return super().construct_mapping(node, deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(text: str, where: str, *, text_if_not_yaml: bool = False) -> Any:
    """`text` read as recipe YAML; whatever it cannot be (a syntax error, a key written twice, an integer of
    thousands of digits, nesting or aliases without end) is an InputError naming `where`, never a traceback.
    `text_if_not_yaml`: text that does not parse as YAML at all is itself the value (a `--set` value)."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        if text_if_not_yaml and isinstance(exc, (yaml.scanner.ScannerError, yaml.parser.ParserError)):
            return text
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{where}:{at}: YAML syntax error: {problem}") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's 4,300 digits
        raise InputError(f"{where}: {str(exc).splitlines()[0]}") from None
    _bounded(data, where)
    return data


def _bounded(data: Any, where: str) -> None:
    """Refuse a value that refers to itself (`&a [*a]`), nests past `_MAX_DEPTH` or expands past `_MAX_NODES` values
    (YAML aliases share one object, so a 1 KB file can stand for billions of values once copied or printed)."""
    stack: list[tuple[Any, int, frozenset[int]]] = [(data, 0, frozenset())]
    count = 0
    while stack:
        value, depth, path = stack.pop()
        count += 1
        if count > _MAX_NODES:
            raise InputError(f"{where}: more than {_MAX_NODES:,} values once its aliases are expanded")
        if depth > _MAX_DEPTH:
            raise InputError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
        if isinstance(value, (dict, list)):
            if id(value) in path:
                raise InputError(f"{where}: a value that contains itself (a YAML alias inside its own anchor)")
            inner = path | {id(value)}
            children = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
            stack.extend((child, depth + 1, inner) for child in children)


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set a.b=VALUE` items into a mapping; VALUE is read as YAML (so 0.05, true, [1, 2] are typed)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not _KEY.fullmatch(key):
            raise InputError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. --set grpo.beta=0.05")
        if raw.strip().lower() in _YAML11_WORDS:  # `save_strategy=no` means the string "no", as TRL's CLI reads it
            out[key] = raw.strip()
            continue
        out[key] = load_yaml(raw, f"--set {key}", text_if_not_yaml=True) if raw.strip() else ""
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys into a (copied) raw recipe mapping."""
    data = copy.deepcopy(data)
    for key, value in overrides.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise InputError(f"override {str(key)[:80]!r}: expected a dotted key such as grpo.beta")
        parts = key.split(".")
        if parts[0] == "store" and isinstance(data.get("store"), dict) and len(parts) == 1 and isinstance(value, str):
            data["store"] = {**data["store"], "url": value}  # --store URL keeps the recipe's retention
            continue
        if parts[0] == "store" and len(parts) > 1 and not isinstance(data.get("store"), dict):
            data["store"] = {"url": data["store"]} if data.get("store") is not None else {}
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise InputError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"recipe {p}: file does not exist")
    if not p.is_file():
        raise InputError(f"recipe {p}: not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"recipe {p}: cannot read it ({exc})") from None
    data = load_yaml(text, f"recipe {p}")
    if data is None:
        raise InputError(f"recipe {p}: file is empty")
    if not isinstance(data, dict):
        raise InputError(f"recipe {p}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _loc(err: dict[str, Any]) -> tuple:
    """The error's location without pydantic's union tags (`data.addition.max_operand` -> `data.max_operand`)."""
    loc = tuple(err["loc"])
    if len(loc) > 1 and loc[0] == "data" and loc[1] in TASKS:
        loc = (loc[0], *loc[2:])
    return loc


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = _loc(err)
        where = ".".join(str(p) for p in loc if p != "__root__")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            section = ".".join(str(p) for p in loc[:-1])
            allowed = _allowed_fields(loc[:-1], err)
            msg = f"unknown {'field' if section else 'section'}" + (
                f"; allowed: {', '.join(allowed)}" if allowed else ""
            )
        elif err["type"] == "union_tag_invalid":
            from regimen.stages.tasks.registry import TASKS

            where, msg = (
                "data.task",
                f"unknown task "
                f"{err.get('input', {}).get('task') if isinstance(err.get('input'), dict) else err.get('input')!r}; "
                f"tasks: {', '.join(TASKS)}",
            )
        elif (
            err["type"] not in ("value_error", "assertion_error")
            and "input" in err
            and not isinstance(err["input"], dict)
        ):
            shown = repr(err["input"])
            msg = f"{msg} (got {shown[:80] + '...' if len(shown) > 80 else shown})"
        lines.append(f"{where}: {msg}" if where else msg)
    return f"recipe {source}: " + "; ".join(lines)


def _allowed_fields(loc: tuple, err: dict[str, Any]) -> list[str]:
    if loc[:1] == ("data",) and len(err["loc"]) > 1 and err["loc"][1] in TASKS:
        return list(TASKS[err["loc"][1]].Options.model_fields)
    model: Any = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        if ann is None:
            return []
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            args = getattr(ann, "__args__", ())
            model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if model is None:
                return []
    return [f.alias or name for name, f in model.model_fields.items()]  # as written in a recipe (`as`, not `as_`)


def trl_check(recipe: Recipe) -> None:
    """Build TRL's own config objects (`recipe/trl.py`): TRL's validation runs now, at the door."""
    try:
        trl.check(recipe)
    except trl.Rejected as exc:
        raise InputError(f"recipe: {exc}") from None


def raw_of(recipe: Recipe) -> dict[str, Any]:
    """The mapping the recipe was validated from (after overrides): what the recipe itself set."""
    return copy.deepcopy(recipe._raw or recipe.model_dump(mode="json", by_alias=True))


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>", *, check_trl: bool = False) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    except (ValueError, TypeError) as exc:  # raised outside pydantic's wrapping (e.g. a reward module's import)
        raise InputError(f"recipe {source}: {exc}") from None
    recipe._raw = copy.deepcopy(data)
    if check_trl:
        trl_check(recipe)
    return recipe


def load_recipe(
    path: str | Path,
    overrides: dict[str, Any] | list[str] | None = None,
    *,
    check_trl: bool = True,
    data: dict[str, Any] | None = None,
) -> Recipe:
    """Read, override, validate and resolve a recipe; any problem is an InputError naming the field or line.
    `data`: the recipe's YAML already read (`read_yaml(path)`), so a command parses it once."""
    if isinstance(overrides, list):
        overrides = parse_set(overrides)
    data = apply_overrides(data if data is not None else read_yaml(path), overrides or {})
    return recipe_from_dict(data, str(path), check_trl=check_trl)


# ---------------------------------------------------------------------------------------------
# `regimen check`: the resolved recipe with where every value came from


def explain(recipe: Recipe, *, all_fields: bool = False, streams: bool = False) -> str:
    """The resolved recipe as YAML, each value commented `# recipe`, `# Regimen: why` or `# TRL default`. `streams`:
    GRPO's prompts come from a stream (`training/sampler.streams`), which sets two of GRPO's fields."""
    raw = raw_of(recipe)
    dumped = recipe.model_dump(mode="json", by_alias=True)
    lines: list[str] = []

    def emit(indent: int, key: str, value: Any, origin: str) -> None:
        flow = isinstance(value, (dict, list))
        text = yaml.safe_dump(
            {key: value}, default_flow_style=False if not flow else None, width=10_000, sort_keys=False
        ).strip()
        if flow:
            text = f"{key}: " + yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
        lines.append(f"{'  ' * indent}{text}  # {origin}")

    def walk(indent: int, node: dict[str, Any], given: Any) -> None:
        for key, value in node.items():
            here = given.get(key, _MISSING) if isinstance(given, dict) else _MISSING
            if isinstance(value, dict) and value and not isinstance(here, list) and key not in ("args", "columns"):
                lines.append(f"{'  ' * indent}{key}:")
                walk(indent + 1, value, here if isinstance(here, dict) else {})
            else:
                emit(indent, key, value, "recipe" if here is not _MISSING else "Regimen default")

    for section, value in dumped.items():
        given = raw.get(section, _MISSING)
        if section in ("sft", "grpo") or (section == "distill" and value is not None):
            _explain_trl(recipe, section, given, all_fields, emit, lines, streams)
        elif section == "eval" and isinstance(value, dict):
            lines.append("eval:")
            for key, val in value.items():
                if key == "max_new_tokens" and val is None:
                    emit(1, key, recipe.max_new_tokens(), "from grpo.max_completion_length")
                else:
                    emit(1, key, val, "recipe" if isinstance(given, dict) and key in given else "Regimen default")
        elif isinstance(value, dict) and value:
            lines.append(f"{section}:")
            walk(1, value, given if isinstance(given, dict) else {})
        elif isinstance(value, list) and section == "rewards":
            lines.append(f"rewards:  # {'recipe' if given is not _MISSING else 'Regimen default'}")
            for item in value:
                lines.append(
                    "  - " + yaml.safe_dump(item, default_flow_style=True, width=10_000, sort_keys=False).strip()
                )
        else:
            emit(0, section, value, "recipe" if given is not _MISSING else "Regimen default")
    return "\n".join(lines) + "\n"


_MISSING = object()


def _explain_trl(
    recipe: Recipe, section: str, given: Any, all_fields: bool, emit, lines: list[str], streams: bool = False
) -> None:
    """A TRL section as training will use it: every value read from the config object itself
    (`recipe/trl.py`), commented with where it came from."""
    built = trl.config(recipe, section)
    lines.append(f"{section}:  # TRL {type(built).__name__}, as training builds it")
    given = given if isinstance(given, dict) else {}
    extra = trl.settings(recipe, section)
    later = trl.stage_time(recipe, section, built, streams=streams)  # set when the trainer is built
    names = defaults.trl_fields(section) if all_fields else defaults.KEY_FIELDS[section]
    shown = []
    for key in [*getattr(recipe, section), *(k for k in extra if k not in getattr(recipe, section)), *later, *names]:
        if key in shown or key in defaults.RESERVED - {"reward_weights"} or not hasattr(built, key):
            continue
        shown.append(key)
        # kept by Regimen, not handed to TRL's config
        if key in given and key in trl.BUILT_BY_REGIMEN and key not in extra:
            emit(1, key, getattr(recipe, section)[key], f"recipe; {trl.BUILT_BY_REGIMEN[key]}")
            continue
        if key in later:
            emit(1, key, later[key][0], f"Regimen, when the trainer is built: {later[key][1]}")
            continue
        if key in given:
            origin = "recipe"
        elif key in defaults.REGIMEN_DEFAULTS[section]:
            origin = f"Regimen: {defaults.REGIMEN_DEFAULTS[section][key][1]}"
        elif key in extra and key in trl.BUILT_BY_REGIMEN:
            origin = f"Regimen, when the trainer is built: {trl.BUILT_BY_REGIMEN[key]}"
        else:
            origin = "TRL default"
        emit(1, key, _plain(getattr(built, key)), origin)
    if not all_fields:
        lines.append(
            f"  # ... and {len(defaults.trl_fields(section)) - len(shown)} more TRL values (regimen check --all)"
        )


def _plain(value: Any) -> Any:
    if hasattr(value, "value") and not isinstance(value, (list, dict)):  # enums
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return str(value)

"""Filters for the roles' settings checks (roles/<role>/tasks/settings.yml).

What a settings check needs beyond one-line YAML asserts: turning ansible's
validate_argument_spec result into messages that name the variable, the value and what was
expected (with the option's type and description from meta/argument_specs.yml), and the
"each of these counts is at least N" rules the stage roles share (of plain settings: at_least;
of a dict setting's fields: fields_at_least).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PASSED = "The arg spec validation passed"
STRUCTURED = ("list", "dict")


def structured_options(spec: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The options declared as list or dict: a string given for one (-e name=a,b) is accepted
    by the validator (a comma-separated list) but not by the tasks."""
    return [name for name, option in spec.items() if option.get("type", "str") in STRUCTURED]


def spec_problems(
    result: Mapping[str, Any], spec: Mapping[str, Mapping[str, Any]], given: Mapping[str, Any]
) -> list[str]:
    """The problems of a validate_argument_spec run (registered with failed_when: false), plus
    each list or dict option of `given` (name -> value) that is a string."""
    if "argument_errors" in result:
        errors = [str(error) for error in result["argument_errors"]]
    else:
        errors = [] if result.get("msg") == PASSED else [str(result.get("msg"))]
    for name in structured_options(spec):
        value = given.get(name)
        if isinstance(value, str):
            kind = spec[name]["type"]
            errors.append(
                f"{name} is the string {json.dumps(value)}, not a {kind} "
                f"(give it as JSON or YAML, e.g. -e '{{\"{name}\": ...}}')"
            )
    return errors


def _expected(name: str, option: Mapping[str, Any]) -> str:
    text = f"{name}: {option.get('type', 'str')}"
    if "elements" in option:
        text += f" of {option['elements']}"
    if "options" in option:
        text += " with keys " + ", ".join(option["options"])
    if "choices" in option:
        text += ", one of " + ", ".join(str(c) for c in option["choices"])
    description = option.get("description", "")
    if isinstance(description, list):
        description = " ".join(description)
    return f"{text} ({re.sub(r'[.]$', '', str(description).strip())})"


def spec_message(problems: Sequence[str], spec: Mapping[str, Mapping[str, Any]], role: str) -> str:
    """The message for `problems` of spec_problems: each problem, then what each option named
    in them expects, and where that is declared."""
    named = [
        _expected(name, option)
        for name, option in spec.items()
        if any(re.search(rf"\b{re.escape(name)}\b", problem) for problem in problems)
    ]
    expected = "".join(f"{item}; " for item in named)
    return (
        f"{role} settings: {'; '.join(problems)}. Expected {expected}"
        f"see roles/{role}/meta/argument_specs.yml."
    )


def at_least(rules: Iterable[Sequence[Any]]) -> list[str]:
    """Each rule is [name, value, floor, what]: a problem for each value below its floor (or
    not a number)."""
    problems = []
    for name, value, floor, what in rules:
        try:
            number = int(value)
        except (TypeError, ValueError):
            problems.append(f"{name} is {json.dumps(value)}, expected a number >= {floor} ({what})")
            continue
        if number < int(floor):
            problems.append(f"{name} is {value}, expected >= {floor} ({what})")
    return problems


def _as_int(value: Any) -> int | None:
    """value as Jinja's int filter reads it ("3", 3.0 and "3.0" are 3); None for no number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return None


def below_floor(values: Mapping[str, Any], floor: int) -> list[str]:
    """A problem for each setting of `values` (name -> value, in order) below `floor`, or not a
    number: "<name> is <value>, expected >= <floor>". For the rules whose message gives no
    purpose (at_least gives one); the value is shown as given, like Jinja's ~ shows it."""
    problems = []
    for name, value in values.items():
        number = _as_int(value)
        if number is None or number < int(floor):
            problems.append(f"{name} is {value}, expected >= {floor}")
    return problems


def fields_at_least(
    settings: Iterable[Sequence[Any]], keys: Sequence[str], floor: float, unit: str = ""
) -> list[str]:
    """Each setting is [name, mapping]: a problem "<name>.<key> is <value>, expected [<unit> ]>=
    <floor>" for each of `keys` of the mapping whose value is below `floor` or not a number (or
    missing), settings and keys in order. For the dict settings whose fields share a floor (the
    synthetic models' sizes, the GB per profile); the value is shown as given, like Jinja's ~."""
    expected = f"{unit} >= {floor}" if unit else f">= {floor}"
    problems = []
    for name, mapping in settings:
        for key in keys:
            value = mapping.get(key) if isinstance(mapping, Mapping) else None
            try:
                below = float(value) < float(floor)
            except (TypeError, ValueError):
                below = True
            if below:
                problems.append(f"{name}.{key} is {value}, expected {expected}")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "specfleet_structured_options": structured_options,
            "specfleet_spec_problems": spec_problems,
            "specfleet_spec_message": spec_message,
            "specfleet_at_least": at_least,
            "specfleet_below_floor": below_floor,
            "specfleet_fields_at_least": fields_at_least,
        }

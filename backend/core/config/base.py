"""The base of every config section: unknown keys refused, docstrings as descriptions, yes/no never a number.

Its own module so that config.py and objective_config.py (which config.py imports) share it.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _numeric(annotation: Any) -> bool:
    """Whether a field holds a number (int, float, or either or None)."""
    return annotation in (int, float) or any(a in (int, float) for a in get_args(annotation))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_yes_no_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1 for a number, so `max_steps: yes` (YAML's true) would run one step
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric(field.annotation):
            example = field.default if isinstance(field.default, (int, float)) else 1
            raise ValueError(f"{str(value).lower()} is a yes/no value, not a number (YAML reads yes, no, on "
                             f"and off as true and false); write a number such as {example}")
        return value

"""The pieces every section of the configuration is built from: the strict base model (an unknown key is refused,
naming it; a section is frozen; each field's docstring is its documentation) and the strict field types."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dunning.secret_env import not_a_secret


class Strict(BaseModel):
    """A section of the configuration: unknown keys refused (naming the key), frozen, documented by the docstring
    under each field (the configuration reference is generated from them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# Strict scalars: YAML `true` is not the number 1, "5" is not 5, and every number has a bound that keeps the
# arithmetic built on it (dates, backoff timestamps) in range; a value past a bound fails here, not mid-run
Count = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Flag = Annotated[bool, Field(strict=True)]
MinorAmount = Annotated[int, Field(strict=True, ge=0, le=10**15)]  # an amount in minor units of its currency
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"  # the name of an environment variable, never a secret itself
# a field naming an environment variable: the pattern (pydantic's message never quotes the input), and a refusal of
# a value shaped like an API key (`secret_env.not_a_secret`), so a secret pasted here is never echoed
EnvName = Annotated[str, Field(pattern=ENV_NAME), AfterValidator(not_a_secret)]
GROUP_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
NAME_PATTERN = r"^[A-Za-z0-9_-]+$"  # a stage's or a policy's name: part of keys, letters, digits, `_` and `-`
MAX_HOURS = 24 * 366

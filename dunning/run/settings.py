"""The deployment's configuration as every command and run loads it: the base's config, its templates checked.

`dunning.config` parses and validates the file and stays in the shared base, below every room; checking the
operator's `templates_dir` needs the template engine (`dunning.email.templating`), a room above it. This module,
on top, does both, so a broken template is a config error (exit 2 naming the file and line) before anything is
claimed, as it always was.
"""

from __future__ import annotations

from pathlib import Path

from dunning.config import DunningConfig, load_config, parse_config
from dunning.errors import ConfigError


def checked(config: DunningConfig, source: str = "config") -> DunningConfig:
    """`config`, once every template its `templates_dir` holds passed the check; ConfigError naming the file."""
    if config.templates_dir is None:
        return config
    from dunning.email.templating import TemplateProblem, check_templates  # here, not at import: it loads Jinja

    try:
        check_templates(config.templates_dir, config.locale)
    except TemplateProblem as exc:
        raise ConfigError(f"{source}: templates_dir: {exc}") from None
    return config


def load_settings(path: str | Path | None) -> DunningConfig:
    """`config.load_config`, templates checked: what the commands, assets and sensors load."""
    return checked(load_config(path), str(path) if path is not None else "config")


def parse_settings(data: object, source: str = "config", base_dir: Path | None = None) -> DunningConfig:
    """`config.parse_config`, templates checked."""
    return checked(parse_config(data, source, base_dir), source)


def template_warnings(config: DunningConfig) -> list[str]:
    """What the operator should hear about their templates, though nothing is wrong enough to refuse them."""
    if config.templates_dir is None:
        return []
    from dunning.email.templating import lone_halves

    return lone_halves(config.templates_dir)

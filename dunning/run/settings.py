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


def _template_dirs(config: DunningConfig) -> list[tuple[str, str]]:
    """(config key, directory) of every templates directory: the top level's and each policy's own."""
    dirs = [("templates_dir", config.templates_dir)] if config.templates_dir is not None else []
    for index, policy in enumerate(config.policies):
        if policy.templates_dir is not None and policy.templates_dir != config.templates_dir:
            dirs.append((f"policies[{index}] ({policy.name}).templates_dir", policy.templates_dir))
    return dirs


def checked(config: DunningConfig, source: str = "config") -> DunningConfig:
    """`config`, once every template its templates directories hold passed the check; ConfigError naming the key
    and the file."""
    dirs = _template_dirs(config)
    if not dirs:
        return config
    from dunning.email.templating import TemplateProblem, check_templates  # here, not at import: it loads Jinja

    for key, directory in dirs:
        try:
            check_templates(directory, config.locale)
        except TemplateProblem as exc:
            raise ConfigError(f"{source}: {key}: {exc}") from None
    return config


def load_settings(path: str | Path | None) -> DunningConfig:
    """`config.load_config`, templates checked: what the commands, assets and sensors load."""
    return checked(load_config(path), str(path) if path is not None else "config")


def parse_settings(data: object, source: str = "config", base_dir: Path | None = None) -> DunningConfig:
    """`config.parse_config`, templates checked."""
    return checked(parse_config(data, source, base_dir), source)


def template_warnings(config: DunningConfig) -> list[str]:
    """What the operator should hear about their templates, though nothing is wrong enough to refuse them."""
    dirs = _template_dirs(config)
    if not dirs:
        return []
    from dunning.email.templating import lone_halves

    return [warning for _, directory in dirs for warning in lone_halves(directory)]

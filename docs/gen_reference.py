"""Run by mkdocs-gen-files while the site builds: the configuration and CLI reference pages, from the code."""

import mkdocs_gen_files

from pipelines.cli.reference import cli_reference_markdown, config_reference_markdown

with mkdocs_gen_files.open("config.md", "w") as page:
    page.write(config_reference_markdown())
with mkdocs_gen_files.open("cli.md", "w") as page:
    page.write(cli_reference_markdown())

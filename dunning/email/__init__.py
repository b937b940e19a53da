"""What a customer reads: every email's context, templates, language, pay link and bytes.

Owns: `context` (what a template sees), `templating` (the sandboxed Jinja environment, packaged `templates/` and
the operator's `templates_dir`), `locales`, `pay_links`, `render` (a group of due rows to one message), `compose`
(the same email written straight to bytes), `wire` (bytes and envelope). May import plan, ingest, ledger and the
base; never send: a provider is handed what this room renders.
"""

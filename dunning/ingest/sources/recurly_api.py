"""A small client of Recurly's API v3 (`Accept: application/vnd.recurly.v2021-02-25`), our own rather than the
official `recurly` SDK: the SDK has no base-URL option (`recurly/base_client.py` opens `HTTPSConnection(host, 443)`
for `v3.recurly.com` or `v3.eu.recurly.com` only), so neither a local fake, a proxy nor `source.api_base` could be
used without patching the standard library. This one is `requests` (already a dependency, proxies from the
environment as usual) against `source.api_base`.

- HTTP Basic with the API key as the user name and an empty password; the version in `Accept`.
- JSON read with `parse_float=Decimal`: Recurly's amounts are decimals in major units, never a float here.
- Lists: follow `next` (a path with the query and an opaque cursor) while `has_more`.
- Every failure is `base.api_failure` (exit 7): the request as fixed text, the status, Recurly's error `type`, and
  for a 429 when to retry (`X-RateLimit-Reset`). `get(..., optional=True)` answers None for a 404 or 501.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import requests

from dunning.ingest.sources.base import api_failure

VENDOR = "Recurly"
ACCEPT = "application/vnd.recurly.v2021-02-25"
MAX_PAGES = 1_000_000  # a `next` that never ends is refused, not followed forever


class RecurlyClient:
    def __init__(self, api_base: str, key: str, key_env: str, timeout: float) -> None:
        self.api_base = api_base.rstrip("/")
        self.key_env = key_env
        self.timeout = timeout
        self.session = requests.Session()
        self.session.auth = (key, "")
        self.session.headers.update({"Accept": ACCEPT, "User-Agent": "dunning-pipeline"})
        self.requests = 0

    def get(self, path: str, params: Mapping[str, Any] | None, request: str, optional: bool = False) -> Any:
        """The JSON body of `GET {api_base}{path}`; `request` names it in a failure (fixed text, no ids)."""
        self.requests += 1
        try:
            response = self.session.get(self.api_base + path, params=params, timeout=self.timeout)
        except requests.RequestException as error:
            raise api_failure(VENDOR, self.api_base, request, status=None, cause=type(error).__name__) from None
        if optional and response.status_code in (404, 501):
            return None
        body: Any = None
        try:
            body = json.loads(response.content, parse_float=Decimal)
        except (ValueError, RecursionError):
            if 200 <= response.status_code < 300:
                raise api_failure(VENDOR, self.api_base, request, status=response.status_code) from None
        if not 200 <= response.status_code < 300 or not isinstance(body, dict):
            problem = body.get("error") if isinstance(body, dict) else None
            code = problem.get("type") if isinstance(problem, dict) else None
            raise api_failure(VENDOR, self.api_base, request, status=response.status_code, code=code,
                              headers=dict(response.headers), key_env=self.key_env)  # fmt: skip
        return body

    def pages(self, path: str, params: Mapping[str, Any], request: str) -> Iterator[dict[str, Any]]:
        """Every item of a list, following `next` while `has_more`."""
        body = self.get(path, params, request)
        for _ in range(MAX_PAGES):
            data = body.get("data")
            if body.get("object") != "list" or not isinstance(data, list):
                raise api_failure(VENDOR, self.api_base, request, status=200)
            yield from (item for item in data if isinstance(item, dict))
            following = body.get("next")
            if not body.get("has_more") or not isinstance(following, str) or not following.startswith("/"):
                return
            parts = urlsplit(following)  # a path (with its query): never another host
            body = self.get(parts.path + (f"?{parts.query}" if parts.query else ""), None, request)
        raise api_failure(VENDOR, self.api_base, request, status=200)

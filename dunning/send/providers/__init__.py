"""The email providers: every send ends `sent`, `failed` or `unknown` (`base`).

Owns: `base` (the provider boundary, the health stop), `file_outbox`, `smtp`, `resend_api`, `factory`. The providers
are independent of each other (a contract); they may import email's `wire` and the base.
"""

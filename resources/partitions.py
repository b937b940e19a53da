"""Daily partitions: one partition per business day.

The partition key is the calendar day the cycle's clock falls on in the
business timezone (`timezone` in the config), computed by the pipeline, not by
Dagster: the config is read at run time, and the definitions must not read it
at import. `end_offset=1` keeps tomorrow's key available for a business
timezone ahead of UTC.
"""

import dagster as dg

daily_partitions = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_offset=1)

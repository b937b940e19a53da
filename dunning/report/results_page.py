"""`dunning report --out FILE.html`: did the reminders bring the money in, on one self-contained page.

Read from the analysts' copy (`HOME/analytics.duckdb`, opened read-only: the pipeline's ledger is never touched):
the funnel (`dunning_funnel`), recovery by stage and policy (`recovery_by_stage`) and the overdue amount over time
(`collections_daily`, the last `days`). Charts are drawn by matplotlib as SVG and embedded inline; the page has no
script and fetches nothing. The HTML is a Jinja template with autoescaping: every value from data is escaped; only
the SVG matplotlib wrote (its text XML-escaped by matplotlib) is inserted as markup.
"""

from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from dunning.email.context import format_amount
from dunning.errors import UserInputError

MAX_ROWS = 400  # rows per table on the page; the analysts' copy has them all


@dataclass(frozen=True)
class Results:
    funnel: pl.DataFrame
    recovery: pl.DataFrame
    daily: pl.DataFrame
    days: int


def _in_stage_order(frame: pl.DataFrame, stage_days: dict[str, int], *others: str) -> pl.DataFrame:
    """Rows by policy, then by the stage's day (a stage no longer configured last), then `others`."""
    day = pl.col("stage").replace_strict(stage_days, default=10**6, return_dtype=pl.Int64)
    return frame.with_columns(day.alias("_day")).sort("policy", "_day", "stage", *others).drop("_day")


def read_results(home: Path, days: int, today: dt.date, stage_days: dict[str, int] | None = None) -> Results:
    """The three tables from `home`'s analysts' copy, stages in the order of their days (`stage_days`: name -> days
    overdue); UserInputError when there is no copy yet."""
    path = home / "analytics.duckdb"
    if not path.is_file():
        raise UserInputError(f"no history to report on: {path} does not exist yet (it is written after each live run)")
    con = duckdb.connect(str(path), read_only=True)
    try:
        funnel = con.sql("SELECT * FROM dunning_funnel ORDER BY policy, stage").pl()
        recovery = con.sql("SELECT * FROM recovery_by_stage ORDER BY policy, stage, currency").pl()
        since = today - dt.timedelta(days=days)
        daily = con.sql(
            "SELECT * FROM collections_daily WHERE business_date > $since ORDER BY business_date, currency",
            params={"since": since},
        ).pl()
    except duckdb.Error as error:
        raise UserInputError(f"{path}: the analysts' copy cannot be read ({type(error).__name__})") from None
    finally:
        con.close()
    order = stage_days or {}
    return Results(_in_stage_order(funnel, order), _in_stage_order(recovery, order, "currency"), daily, days)


def _figure(width: float = 7, height: float = 3.2) -> tuple[Any, Any, Any]:
    import matplotlib

    matplotlib.use("svg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "dunning", "font.size": 10,
                         "axes.spines.top": False, "axes.spines.right": False})  # fmt: skip
    return plt, *plt.subplots(figsize=(width, height))


def _svg(plt: Any, fig: Any) -> Markup:
    out = io.StringIO()
    fig.tight_layout()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = out.getvalue()
    return Markup(text[text.index("<svg") :])  # noqa: S704 - matplotlib's own SVG, its text XML-escaped


def funnel_chart(funnel: pl.DataFrame) -> Markup | None:
    if funnel.is_empty():
        return None
    plt, fig, ax = _figure()
    labels = [f"{p}\n{s}" for p, s in funnel.select("policy", "stage").iter_rows()]
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], funnel.get_column("invoices_reached").to_list(), 0.4, label="invoices reached")
    ax.bar([i + 0.2 for i in x], funnel.get_column("paid_after").to_list(), 0.4, label="paid after")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("invoices")
    ax.legend(frameon=False)
    return _svg(plt, fig)


def recovery_chart(recovery: pl.DataFrame) -> Markup | None:
    if recovery.is_empty():
        return None
    rows = recovery.with_columns(
        (pl.col("paid_within_7d") / pl.col("reminders_sent") * 100).alias("r7"),
        (pl.col("paid_within_30d") / pl.col("reminders_sent") * 100).alias("r30"),
    )
    plt, fig, ax = _figure(height=max(2.4, 0.42 * rows.height + 1))
    labels = [f"{p} · {s} · {c}" for p, s, c in rows.select("policy", "stage", "currency").iter_rows()]
    y = list(range(rows.height))[::-1]  # the first row on top
    ax.barh([i + 0.2 for i in y], rows.get_column("r7").to_list(), 0.4, label="paid within 7 days")
    ax.barh([i - 0.2 for i in y], rows.get_column("r30").to_list(), 0.4, label="paid within 30 days")
    ax.set_yticks(y, labels)
    ax.set_xlabel("% of reminders sent")
    ax.set_xlim(0, 100)
    ax.legend(frameon=False, loc="lower right")
    return _svg(plt, fig)


MIN_TREND_DAYS = 3  # days of snapshots before the overdue amount is drawn over time (fewer: said in words)
RECOVERY_DAYS = 7  # a reminder's "paid within 7 days" is known only a week after it


def overdue_charts(daily: pl.DataFrame) -> list[tuple[str, Markup]]:
    """One small chart per currency (amounts of different currencies never share an axis: a yen total would
    flatten euros to a line at zero), each with plain numbers on its axis (no `1e6` multiplier) and its days as
    dates; none until `MIN_TREND_DAYS` days of snapshots."""
    if daily.is_empty() or daily.get_column("business_date").n_unique() < MIN_TREND_DAYS:
        return []
    import babel.numbers
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.ticker import FuncFormatter

    charts = []
    for (currency,), part in daily.sort("business_date").group_by("currency", maintain_order=True):
        plt, fig, ax = _figure(width=5, height=2.6)
        scale = 10 ** babel.numbers.get_currency_precision(str(currency))
        amounts = [a / scale for a in part.get_column("overdue_amount_minor").to_list()]
        ax.plot(part.get_column("business_date").to_list(), amounts, marker="o", markersize=3)
        ax.set_title(f"overdue, {currency}", loc="left", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
        locator = AutoDateLocator(maxticks=6)  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        charts.append((str(currency), _svg(plt, fig)))
    return charts


def history_note(daily: pl.DataFrame, days_of_data: int, first_day: dt.date | None) -> str | None:
    """What the page will show once there is enough history, in place of charts with nothing to draw."""
    if days_of_data >= MIN_TREND_DAYS:
        return None
    if first_day is None:
        return "No daily history yet: each live run adds a day, and this page draws the overdue amount per " \
            "currency from the third day on."  # fmt: skip
    latest = daily.filter(pl.col("business_date") == daily.get_column("business_date").max())
    today = ", ".join(_money(a, c) for c, a in latest.select("currency", "overdue_amount_minor").iter_rows())
    return (
        f"{days_of_data} day(s) of history so far (since {first_day}): overdue now {today or 'nothing'}. "
        f"From {first_day + dt.timedelta(days=MIN_TREND_DAYS - 1)} on (after the next snapshots), this page draws "
        "the overdue amount of each currency over time."
    )


def _money(amount: int, currency: str) -> str:
    return format_amount(int(amount), currency)


def render_page(results: Results, generated: dt.datetime) -> str:
    env = Environment(loader=PackageLoader("dunning.report", "templates"), autoescape=select_autoescape(["j2", "html"]))
    env.filters["safe_svg"] = lambda svg: svg if isinstance(svg, Markup) else ""
    recovery = [
        {**r, "recovered": _money(r["amount_recovered_minor"], r["currency"]),
         "median_days_to_pay": "–" if r["median_days_to_pay"] is None else f"{r['median_days_to_pay']:g}",
         "fees_claimed": _money(r.get("fees_claimed_minor") or 0, r["currency"]),
         "fees_collected": _money(r.get("fees_collected_minor") or 0, r["currency"])}
        for r in results.recovery.head(MAX_ROWS).to_dicts()
    ]  # fmt: skip
    daily = [
        {**r, "overdue_amount": _money(r["overdue_amount_minor"], r["currency"]),
         "recovered": _money(r["amount_recovered_minor"], r["currency"])}
        for r in results.daily.tail(MAX_ROWS).to_dicts()
    ]  # fmt: skip
    dates = results.daily.get_column("business_date") if results.daily.height else None
    days_of_data = dates.n_unique() if dates is not None else 0
    funnel = [
        {**r, "paid_rate": "–" if r["paid_rate"] is None or (not r["paid_after"] and days_of_data < RECOVERY_DAYS)
         else f"{r['paid_rate'] * 100:.1f} %",
         "median_days_to_pay": "–" if r["median_days_to_pay"] is None else f"{r['median_days_to_pay']:g}"}
        for r in results.funnel.head(MAX_ROWS).to_dicts()
    ]  # fmt: skip
    sent = int(results.recovery.get_column("reminders_sent").sum()) if results.recovery.height else 0
    paid30 = int(results.recovery.get_column("paid_within_30d").sum()) if results.recovery.height else 0
    recovered = results.recovery.group_by("currency").agg(pl.col("amount_recovered_minor").sum()).sort("currency")
    first_day: dt.date | None = dates.min() if dates is not None else None  # type: ignore[assignment]
    last_day: dt.date | None = dates.max() if dates is not None else None  # type: ignore[assignment]
    # a rate is only known a week after the first reminders: until then it is "not yet", never a 0.0 % that reads
    # as a failure
    measurable = first_day is not None and days_of_data >= RECOVERY_DAYS
    rates_from = first_day + dt.timedelta(days=RECOVERY_DAYS) if first_day is not None else None
    cards = [
        {"label": "reminders sent", "value": f"{sent:,}"},
        {"label": "paid within 30 days of a reminder",
         "value": f"{paid30 / sent * 100:.1f} %" if sent and (measurable or paid30) else "–"},
    ]  # fmt: skip
    cards += [{"label": f"recovered in {c}", "value": _money(a, c)} for c, a in recovered.iter_rows()]  # fmt: skip
    if "fees_claimed_minor" in results.recovery.columns:  # late fees (`dunning.fees`), where any were claimed
        fees = results.recovery.group_by("currency").agg(pl.col("fees_claimed_minor", "fees_collected_minor").sum())
        cards += [
            {"label": f"fees claimed in {c} (collected)", "value": f"{_money(a, c)} ({_money(b, c)})"}
            for c, a, b in fees.sort("currency").iter_rows() if a
        ]  # fmt: skip
    return env.get_template("results.html.j2").render(
        generated=generated.strftime("%Y-%m-%d %H:%M UTC"), days=results.days, first_day=first_day,
        last_day=last_day, days_of_data=days_of_data, cards=cards, funnel=funnel, recovery=recovery, daily=daily,
        funnel_chart=funnel_chart(results.funnel),
        recovery_chart=recovery_chart(results.recovery) if measurable or paid30 else None,
        rates_from=None if measurable or paid30 or not sent else rates_from,
        overdue_charts=overdue_charts(results.daily),
        history_note=history_note(results.daily, days_of_data, first_day),
    )  # fmt: skip

"""``examples/monitoring``: every query of the Grafana dashboard names a metric series and
labels that ``gshare serve`` declares (the gateway's registry, with the workflow metrics the
workflow router and the stage scheduler add), so the dashboard cannot silently show nothing
after a metric is renamed. Pure: no process; the registry is built in-process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from gshare.runtime.gateway import stages, workflows
from gshare.runtime.gateway.router import Gateway

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
SERIES = re.compile(r"\b(gshare_[a-z_]+)\b")
# label names inside {...} selectors and by (...) / label_values(..., label) clauses
SELECTOR = re.compile(r"(gshare_[a-z_]+)\{([^}]*)\}")
BY = re.compile(r"\bby \(([^)]*)\)")


def declared() -> dict[str, set[str]]:
    """Series name -> label names, for every metric the server declares."""
    gw = Gateway()
    stages._make_metrics(gw)
    workflows._make_metrics(gw)
    out: dict[str, set[str]] = {}
    registry = gw.metrics.registry
    # prometheus_client's own map: collector -> every series name it exposes (_total, _bucket…)
    for collector, names in registry._collector_to_names.items():  # noqa: SLF001
        labels = set(getattr(collector, "_labelnames", ()))
        if not labels:  # a custom collector: the labels of what it exposes
            labels = {k for fam in collector.collect() for smp in fam.samples for k in smp.labels}
        if not names:  # registered without describe(): the names of what it exposes
            names = {smp.name for fam in collector.collect() for smp in fam.samples}
        for n in names:
            out[n] = labels | ({"le"} if n.endswith("_bucket") else set())
    return out


def dashboard() -> dict[str, object]:
    return json.loads((EXAMPLES / "grafana-dashboard.json").read_text())


def queries(dash: dict[str, object]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]  # type: ignore[attr-defined]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]  # type: ignore[index]
    return exprs


def test_every_query_is_valid_promql() -> None:
    """Parsed by promql-parser (Prometheus's grammar), the dashboard variables replaced by a
    regular expression, as Grafana does before it sends a query."""
    import promql_parser

    exprs = queries(dashboard())
    for e in exprs:
        if e.startswith("label_values("):  # Grafana's own function, not PromQL
            continue
        try:
            promql_parser.parse(re.sub(r"\$[a-z_]+", ".*", e))
        except ValueError as err:
            raise AssertionError(f"{e!r}: {err}") from None


def test_every_query_names_a_declared_series_and_its_labels() -> None:
    known = declared()
    exprs = queries(dashboard())
    assert len(exprs) > 30
    used: set[str] = set()
    for e in exprs:
        names = SERIES.findall(e)
        assert names, f"no gshare metric in {e!r}"
        for n in names:
            assert n in known, f"{n} (in {e!r}) is not declared; declared: {sorted(known)}"
            used.add(n)
        for n, body in SELECTOR.findall(e):
            for label in re.findall(r"([a-z_]+)\s*=~?", body):
                assert label in known[n], f"{n} has no label {label!r} (in {e!r})"
        for clause in BY.findall(e):
            wanted = {x.strip() for x in clause.split(",")}
            assert any(wanted <= known[n] for n in names), f"by ({clause}) in {e!r}"
        for n, label in re.findall(r"label_values\((gshare_[a-z_]+),\s*([a-z_]+)\)", e):
            assert label in known[n], e
    # the dashboard covers every metric family the server declares
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in known}
    covered = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    assert families - covered == set(), f"not on the dashboard: {sorted(families - covered)}"


def test_the_dashboard_is_well_formed() -> None:
    dash = dashboard()
    ids = [p["id"] for p in dash["panels"]]  # type: ignore[index]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in dash["panels"]:  # type: ignore[attr-defined]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
    names = {v["name"] for v in dash["templating"]["list"]}  # type: ignore[index]
    for e in queries(dash):
        for var in re.findall(r"\$([a-z_]+)", e):
            assert var in names, f"${var} is not a dashboard variable ({e!r})"


def test_the_prometheus_example_scrapes_the_gateway() -> None:
    cfg = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    (job,) = cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]

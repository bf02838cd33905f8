"""The dashboard Terraform makes (dashboard.json.tftpl, rendered as templatefile would): valid
JSON for google_monitoring_dashboard, tiles that fit a 48-column mosaic without overlapping, and a
panel for each thing an operator of Drip watches."""

from __future__ import annotations

import json
import pathlib
import re

TERRAFORM = pathlib.Path(__file__).resolve().parent.parent
VARIABLES = {"name": "drip", "limiter": "drip-limiter", "queues": "drip-0|drip-1", "dlqs": "drip-dlq"}


def rendered() -> dict:
    text = (TERRAFORM / "dashboard.json.tftpl").read_text()
    names = set(re.findall(r"\$\{(\w+)\}", text))
    assert names <= set(VARIABLES), f"the template uses variables Terraform does not pass: {names - set(VARIABLES)}"
    for name, value in VARIABLES.items():
        text = text.replace("${" + name + "}", value)
    return json.loads(text)


def queries(dashboard: dict) -> list[str]:
    return [
        data_set["timeSeriesQuery"]["prometheusQuery"]
        for tile in dashboard["mosaicLayout"]["tiles"]
        for data_set in tile["widget"]["xyChart"]["dataSets"]
    ]


def test_terraform_renders_the_template_with_the_variables_it_uses():
    monitoring = (TERRAFORM / "monitoring.tf").read_text()
    assert 'templatefile("${path.module}/dashboard.json.tftpl"' in monitoring
    for name in VARIABLES:
        assert re.search(rf"\b{name}\s*=", monitoring), f"monitoring.tf does not pass {name}"


def test_tiles_fit_the_mosaic_without_overlapping():
    dashboard = rendered()
    columns = dashboard["mosaicLayout"]["columns"]
    cells = set()
    for tile in dashboard["mosaicLayout"]["tiles"]:
        assert tile["widget"]["title"]
        assert 0 <= tile["xPos"] and tile["xPos"] + tile["width"] <= columns, tile["widget"]["title"]
        for x in range(tile["xPos"], tile["xPos"] + tile["width"]):
            for y in range(tile["yPos"], tile["yPos"] + tile["height"]):
                assert (x, y) not in cells, f"{tile['widget']['title']} overlaps another tile"
                cells.add((x, y))


def test_every_operator_question_has_a_panel():
    text = "\n".join(queries(rendered()))
    for needed in [
        "drip_decisions_total",
        "drip_delay_seconds_bucket",
        "drip_max_delay_seconds",
        "drip_delay_seconds_max",
        "drip_dispatch_lateness_seconds_bucket",
        "drip_delivery_margin_seconds",
        "subscription_num_undelivered_messages",
        "subscription_oldest_unacked_message_age",
        "cloudtasks_googleapis_com:queue_depth",
        'subscription_id=~"drip-dlq"',
        "redis_googleapis_com:stats_memory_usage_ratio",
        "redis_googleapis_com:stats_cpu_utilization",
        'run_googleapis_com:request_count{monitored_resource="cloud_run_revision",service_name="drip-limiter"}',
        "drip_adaptive_level",
        "drip_pauses_capped_total",
    ]:
        assert needed in text, f"no panel queries {needed}"

"""The dashboard Terraform makes (dashboard.json.tftpl, rendered as templatefile would): valid
JSON for google_monitoring_dashboard, tiles that fit a 48-column mosaic without overlapping, and a
panel for each thing an operator of Drip watches."""

from __future__ import annotations

import json
import pathlib
import re

TERRAFORM = pathlib.Path(__file__).resolve().parent.parent
INSTANCE = 'instance_id="projects/p/locations/r/instances/drip"'
VARIABLES = {
    "name": "drip",
    "limiter": "drip-limiter",
    "queues": "drip-0|drip-1",
    "dlqs": "drip-dlq",
    "redis_memory": f'max (redis_googleapis_com:stats_memory_usage_ratio{{monitored_resource="redis_instance",{INSTANCE}}})',
    "redis_cpu": f'max (redis_googleapis_com:stats_cpu_utilization{{monitored_resource="redis_instance",{INSTANCE}}})',
}


def rendered(variables: dict[str, str] = VARIABLES) -> dict:
    """As templatefile renders it: ${name} as the value, ${jsonencode(name)} as a JSON string."""
    text = (TERRAFORM / "dashboard.json.tftpl").read_text()
    names = set(re.findall(r"\$\{(?:jsonencode\()?(\w+)\)?\}", text))
    assert names <= set(variables), f"the template uses variables Terraform does not pass: {names - set(variables)}"
    for name, value in variables.items():
        text = text.replace("${jsonencode(" + name + ")}", json.dumps(value)).replace("${" + name + "}", value)
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
        f"redis_googleapis_com:stats_memory_usage_ratio{{monitored_resource=\"redis_instance\",{INSTANCE}}}",
        f"redis_googleapis_com:stats_cpu_utilization{{monitored_resource=\"redis_instance\",{INSTANCE}}}",
        'run_googleapis_com:request_count{monitored_resource="cloud_run_revision",service_name="drip-limiter"}',
        "drip_adaptive_level",
        "drip_pauses_capped_total",
        "drip_delay_seconds_by_class_bucket",
        "drip_latency_percentile_ms",
        "drip_latency_reports_total",
        "drip_budget_leased_units_total",
        "drip_budget_returned_units_total",
        "drip_budget_leases_total",
        "drip_fair_wait_seconds_bucket",
        "drip_fair_waiting_keys",
        "drip_fair_booked_units_total",
    ]:
        assert needed in text, f"no panel queries {needed}"


def test_the_redis_tile_reads_this_deployment_s_memorystore_only():
    """Instance or cluster, the queries monitoring.tf passes name this deployment's Redis: a tile
    over every Redis of the project would mislead, and one over redis_instance alone stays blank
    on a cluster."""
    monitoring = (TERRAFORM / "monitoring.tf").read_text()
    for metric in ["stats_memory_usage_ratio", "stats_cpu_utilization"]:
        assert re.search(rf'{metric}\{{monitored_resource=\\"redis_instance\\",instance_id=\\"projects/\$\{{var\.project_id\}}/locations/\$\{{var\.region\}}/instances/\$\{{var\.name\}}', monitoring), metric
    for metric in ["cluster_memory_maximum_utilization", "cluster_cpu_maximum_utilization"]:
        assert re.search(rf'{metric}\{{monitored_resource=\\"redis\.googleapis\.com/Cluster\\",cluster_id=\\"\$\{{var\.name\}}', monitoring), metric
    assert "var.redis_cluster ?" in monitoring[monitoring.index("redis_memory"):]

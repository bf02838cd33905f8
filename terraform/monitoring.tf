# Alerts: an event dead-lettered for max_delay (an upstream flood, or limits too tight),
# dead-lettered messages waiting to be looked at, and a rules file the services refused.

resource "google_logging_metric" "max_delay_exceeded" {
  project     = var.project_id
  name        = "${var.name}-max-delay-exceeded"
  description = "Events the limiter dead-lettered because their earliest slot was beyond the rule's max_delay."
  filter      = <<-EOT
    resource.type="cloud_run_revision"
    resource.labels.service_name="${local.limiter_name}"
    severity>=ERROR
    jsonPayload.decision="max_delay_exceeded"
  EOT

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "rule"
      value_type  = "STRING"
      description = "The rule whose max_delay was exceeded."
    }
  }

  label_extractors = {
    rule = "EXTRACT(jsonPayload.rule)"
  }
}

resource "google_monitoring_alert_policy" "max_delay_exceeded" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): events beyond max_delay"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "max_delay_exceeded logged"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"logging.googleapis.com/user/${google_logging_metric.max_delay_exceeded.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Drip dead-lettered events whose earliest slot lay beyond their rule's max_delay (attribute drip-reason=max_delay_exceeded). Look for an upstream publisher flooding one key (drip inspect shows the backlog), then replay the DLQ subscription once it drains (drip dlq replay --reason max_delay_exceeded)."
  }
}

# A new rules version that does not validate is refused and the old rules stay in force (docs/rules.md:
# "Changing limits"): the operator who added it must hear of it.
resource "google_logging_metric" "rules_refused" {
  project     = var.project_id
  name        = "${var.name}-rules-refused"
  description = "Times a service refused a new version of the rules file (the rules in force stayed)."
  filter      = <<-EOT
    resource.type="cloud_run_revision"
    resource.labels.service_name=("${local.limiter_name}" OR "${local.dispatcher_name}")
    severity>=ERROR
    jsonPayload.message="new rules refused: the rules in force stay"
  EOT

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }
}

resource "google_monitoring_alert_policy" "rules_refused" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): a rules file was refused"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "new rules refused"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"logging.googleapis.com/user/${google_logging_metric.rules_refused.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A service refused the newest version of the rules file (Secret Manager's latest) and keeps running the previous one. The ERROR line names the file, rule, field and reason; `drip check-config` shows the same. Add a fixed version; `drip_rules_info` and `/readyz` show which version each instance runs."
  }
}

resource "google_monitoring_alert_policy" "dlq_backlog" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): dead-lettered messages waiting"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "undelivered messages on a Drip DLQ subscription"
    condition_threshold {
      filter          = "resource.type=\"pubsub_subscription\" AND metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND resource.label.subscription_id=one_of(${join(",", [for s in google_pubsub_subscription.dlq : "\"${s.name}\""])})"
      comparison      = "COMPARISON_GT"
      threshold_value = var.dlq_backlog_threshold
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Messages wait on a Drip dead-letter subscription. Each carries drip-reason (and drip-rule, drip-key, drip-detail): fix the cause, then replay them: drip dlq replay --subscription <this subscription> --topic <the source topic> (--dry-run first; --reason, --rule, --key pick which)."
  }
}

# With noeviction a full Redis refuses writes: every push is answered 503 until memory frees up.
# Alert at 80 % so the instance can be resized (docs/capacity.md: "Capacity") before that happens.
resource "google_monitoring_alert_policy" "redis_memory" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): Redis memory above ${var.redis_memory_alert_ratio * 100} %"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Memorystore memory usage"
    condition_threshold {
      filter = var.redis_cluster ? (
        "resource.type=\"redis.googleapis.com/Cluster\" AND metric.type=\"redis.googleapis.com/cluster/memory/maximum_utilization\" AND resource.label.cluster_id=\"${var.name}\""
        ) : (
        "resource.type=\"redis_instance\" AND metric.type=\"redis.googleapis.com/stats/memory/usage_ratio\" AND resource.label.instance_id=\"projects/${var.project_id}/locations/${var.region}/instances/${var.name}\""
      )
      comparison      = "COMPARISON_GT"
      threshold_value = var.redis_memory_alert_ratio
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Drip's Redis is filling up. Its maxmemory-policy is noeviction, so when full, every write fails and the limiter answers 503 (Pub/Sub redelivers; nothing is lost, but nothing moves). Resize the instance (docs/capacity.md: bytes per in-flight message and per entity) or shorten max_delay."
  }
}

# One downstream answer pauses a key or budget for at most the rule's max_pause (docs/design.md: "When the
# downstream says wait"). An answer that asked for longer was capped: a partner in trouble, or a
# misconfigured Retry-After, that someone should look at before the backlog builds up.
resource "google_logging_metric" "long_pauses" {
  project     = var.project_id
  name        = "${var.name}-long-pauses"
  description = "Downstream answers whose Retry-After was longer than the rule's max_pause (capped)."
  filter      = <<-EOT
    resource.type="cloud_run_revision"
    resource.labels.service_name=("${local.limiter_name}" OR "${local.dispatcher_name}")
    jsonPayload.message="the downstream asked to wait longer than max_pause: pause capped, read as overload"
  EOT

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }
}

resource "google_monitoring_alert_policy" "long_pauses" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): a downstream asked to wait longer than max_pause"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "pause capped at max_pause"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"logging.googleapis.com/user/${google_logging_metric.long_pauses.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A partner answered 429/503 with a Retry-After longer than the rule's `max_pause` (or a `/v1/feedback` call asked for it). Drip paused the key or budget for `max_pause` only and lowered its adaptive level. The WARN line names the rule, key and target; `drip inspect RULE KEY` shows the pause and the backlog. Ask the partner about the outage; if it lasts, raise `max_delay` or pause the source subscription."
  }
}

# Alerts coupled to lag: a throttle whose slowdown nobody sees becomes a silent chronic fault.

resource "google_monitoring_alert_policy" "push_lag" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): the limiter falls behind its push subscriptions"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "oldest unacked message on a push subscription"
    condition_threshold {
      filter          = "resource.type=\"pubsub_subscription\" AND metric.type=\"pubsub.googleapis.com/subscription/oldest_unacked_message_age\" AND resource.label.subscription_id=one_of(${join(",", [for s in google_pubsub_subscription.push : "\"${s.name}\""])})"
      comparison      = "COMPARISON_GT"
      threshold_value = var.push_lag_threshold_seconds
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A push subscription's oldest unacked message is older than the threshold: the limiter is not acking (5xx: Redis, Pub/Sub or Cloud Tasks failing; see the 5xx alert and the limiter's logs) or cannot keep up (max_instances, Redis CPU). Nothing is lost while Pub/Sub retains the messages; events wait longer than their rules' schedules."
  }
}

resource "google_monitoring_alert_policy" "limiter_errors" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): the limiter answers 5xx"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "share of limiter requests answered 5xx"
    condition_threshold {
      filter             = "resource.type=\"cloud_run_revision\" AND resource.label.service_name=\"${local.limiter_name}\" AND metric.type=\"run.googleapis.com/request_count\" AND metric.label.response_code_class=\"5xx\""
      denominator_filter = "resource.type=\"cloud_run_revision\" AND resource.label.service_name=\"${local.limiter_name}\" AND metric.type=\"run.googleapis.com/request_count\""
      comparison         = "COMPARISON_GT"
      threshold_value    = var.limiter_error_ratio
      duration           = "600s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_RATE"
        cross_series_reducer = "REDUCE_SUM"
      }
      denominator_aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_RATE"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "More of the limiter's requests than the threshold end in 5xx. A 503 asks Pub/Sub to redeliver (nothing is lost), so a few are normal (a redelivery racing its original is answered 503 until the first attempt completes); many mean a dependency fails: the limiter's WARN lines (\"push failed; Pub/Sub will redeliver\") name it, and drip_dependency_call_seconds{result=\"error\"} shows which."
  }
}

resource "google_monitoring_alert_policy" "dispatch_lateness" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): delayed events arrive later than their delivery margin"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "p99 dispatch lateness above the rule's delivery_margin"
    condition_prometheus_query_language {
      query    = "histogram_quantile(0.99, sum by (rule, le) (rate(drip_dispatch_lateness_seconds_bucket[10m]))) > on (rule) (max by (rule) (drip_delivery_margin_seconds) > 0)"
      duration = "600s"
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "Cloud Tasks hands delayed events to the dispatcher later after their slots than the rule's delivery_margin allows, so the partner may see more in a window than the limit (docs/design.md: \"Scheduling semantics\"). Check the queues' dispatch rate (500/s per queue: add queues), the dispatcher's max_instances and its errors; raise the rule's delivery_margin if the lateness is steady."
  }
}

resource "google_monitoring_alert_policy" "drain_near_max_delay" {
  project               = var.project_id
  display_name          = "Drip (${var.name}): a rule's delays approach its max_delay"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "the longest delay any key got above ${var.drain_alert_fraction * 100} % of the rule's max_delay"
    condition_prometheus_query_language {
      query    = "max by (rule) (drip_delay_seconds_max) > on (rule) (${var.drain_alert_fraction} * max by (rule) (drip_max_delay_seconds))"
      duration = "120s"
    }
  }

  conditions {
    display_name = "p99 delay above ${var.drain_alert_fraction * 100} % of the rule's max_delay"
    condition_prometheus_query_language {
      query    = "histogram_quantile(0.99, sum by (rule, le) (rate(drip_delay_seconds_bucket[10m]))) > on (rule) (${var.drain_alert_fraction} * max by (rule) (drip_max_delay_seconds))"
      duration = "300s"
    }
  }

  documentation {
    mime_type = "text/markdown"
    content   = "A key of this rule (the longest delay any key got: drip_delay_seconds_max), or its slowest keys (p99), are being scheduled close to its max_delay: once a key's backlog drains later than max_delay, its new events are dead-lettered (max_delay_exceeded). `drip inspect RULE KEY` shows a key's backlog and drain time. Slow the upstream publisher, raise the key's limit if the partner allows (`drip limits set`), or raise max_delay."
  }
}

# One dashboard of what an operator of Drip watches (its JSON: dashboard.json.tftpl): decisions,
# delays against max_delay, dispatch lateness against the delivery margin, the push backlog, the
# queues, the dead letters, Redis, the limiter's answers, adaptive levels and capped pauses.
resource "google_monitoring_dashboard" "drip" {
  project = var.project_id
  dashboard_json = templatefile("${path.module}/dashboard.json.tftpl", {
    name    = var.name
    limiter = local.limiter_name
    queues  = join("|", local.queue_ids)
    dlqs    = join("|", [for s in google_pubsub_subscription.dlq : s.name])
    # This deployment's Memorystore only, instance or cluster (other Redis of the project stay out).
    redis_memory = var.redis_cluster ? (
      "max (redis_googleapis_com:cluster_memory_maximum_utilization{monitored_resource=\"redis.googleapis.com/Cluster\",cluster_id=\"${var.name}\"})"
      ) : (
      "max (redis_googleapis_com:stats_memory_usage_ratio{monitored_resource=\"redis_instance\",instance_id=\"projects/${var.project_id}/locations/${var.region}/instances/${var.name}\"})"
    )
    redis_cpu = var.redis_cluster ? (
      "max (redis_googleapis_com:cluster_cpu_maximum_utilization{monitored_resource=\"redis.googleapis.com/Cluster\",cluster_id=\"${var.name}\"})"
      ) : (
      "max (redis_googleapis_com:stats_cpu_utilization{monitored_resource=\"redis_instance\",instance_id=\"projects/${var.project_id}/locations/${var.region}/instances/${var.name}\"})"
    )
  })
}

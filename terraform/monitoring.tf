# Alerts: an event dead-lettered for max_delay (an upstream flood, or limits too tight), and
# dead-lettered messages waiting to be looked at.

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
    content   = "Drip dead-lettered events whose earliest slot lay beyond their rule's max_delay (attribute drip-reason=max_delay_exceeded). Look for an upstream publisher flooding one key (drip inspect shows the backlog), then replay the DLQ subscription once it drains."
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
    content   = "Messages wait on a Drip dead-letter subscription. Each carries drip-reason (and drip-rule, drip-key, drip-detail): fix the cause, then republish the data to the source topic."
  }
}

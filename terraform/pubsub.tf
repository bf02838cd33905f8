# Topics of the rules file, the push subscriptions that feed the limiter, and a pull subscription
# on every dead-letter topic (a topic nobody subscribes to loses what is published to it).

resource "google_pubsub_topic" "source" {
  # checkov:skip=CKV_GCP_83:Google-managed encryption at rest applies; a customer-managed key is opt-in through var.topic_kms_key_name (it needs the Pub/Sub agent granted on the key, which this module does not own).
  for_each = var.create_source_topics ? toset(var.source_topics) : toset([])

  project      = var.project_id
  name         = each.value
  kms_key_name = var.topic_kms_key_name
  labels       = local.labels
}

resource "google_pubsub_topic" "forward" {
  # checkov:skip=CKV_GCP_83:Google-managed encryption at rest applies; a customer-managed key is opt-in through var.topic_kms_key_name (it needs the Pub/Sub agent granted on the key, which this module does not own).
  for_each = local.forward_topics

  project      = var.project_id
  name         = each.value
  kms_key_name = var.topic_kms_key_name
  labels       = local.labels
}

resource "google_pubsub_topic" "overflow" {
  # checkov:skip=CKV_GCP_83:Google-managed encryption at rest applies; a customer-managed key is opt-in through var.topic_kms_key_name (it needs the Pub/Sub agent granted on the key, which this module does not own).
  for_each = local.overflow_topics

  project      = var.project_id
  name         = each.value
  kms_key_name = var.topic_kms_key_name
  labels       = local.labels
}

resource "google_pubsub_topic" "dlq" {
  # checkov:skip=CKV_GCP_83:Google-managed encryption at rest applies; a customer-managed key is opt-in through var.topic_kms_key_name (it needs the Pub/Sub agent granted on the key, which this module does not own).
  for_each = setunion(local.dlq_topics, [local.push_dead_letter_topic])

  project                    = var.project_id
  name                       = each.value
  kms_key_name               = var.topic_kms_key_name
  message_retention_duration = "604800s"
  labels                     = local.labels
}

resource "google_pubsub_subscription" "dlq" {
  for_each = google_pubsub_topic.dlq

  project                    = var.project_id
  name                       = each.value.name
  topic                      = each.value.id
  ack_deadline_seconds       = 60
  message_retention_duration = "604800s"
  retain_acked_messages      = true
  labels                     = local.labels

  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_subscription" "consumer" {
  for_each = var.create_consumer_subscriptions ? merge(google_pubsub_topic.forward, google_pubsub_topic.overflow) : {}

  project              = var.project_id
  name                 = each.value.name
  topic                = each.value.id
  ack_deadline_seconds = 60
  labels               = local.labels

  expiration_policy {
    ttl = ""
  }
}

resource "google_pubsub_subscription" "push" {
  for_each = toset(var.source_topics)

  project              = var.project_id
  name                 = "${var.name}-limiter-${each.value}"
  topic                = "projects/${var.project_id}/topics/${each.value}"
  ack_deadline_seconds = var.push_ack_deadline_seconds
  labels               = local.labels

  push_config {
    push_endpoint = "${local.limiter_url}/push"

    oidc_token {
      service_account_email = google_service_account.push.email
      audience              = local.limiter_url
    }
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dlq[local.push_dead_letter_topic].id
    max_delivery_attempts = var.push_max_delivery_attempts
  }

  retry_policy {
    minimum_backoff = "1s"
    maximum_backoff = "60s"
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [google_pubsub_topic.source]
}

# The Pub/Sub service agent forwards undeliverable pushes to the dead-letter topic: it must
# publish there and acknowledge on the push subscription, and nothing more.
resource "google_pubsub_topic_iam_member" "agent_publishes_push_dead_letters" {
  project = var.project_id
  topic   = google_pubsub_topic.dlq[local.push_dead_letter_topic].name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "agent_acks_push" {
  for_each = google_pubsub_subscription.push

  project      = var.project_id
  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

locals {
  # The rules' topics as Drip reads the rules (`drip rules topics`): those named by id are created
  # here; full names (projects/.../topics/...) are someone else's and left alone.
  rules_topics    = jsondecode(file(var.rules_topics_file))
  forward_topics  = toset(local.rules_topics.forward)
  overflow_topics = toset(local.rules_topics.overflow)
  dlq_topics      = toset(local.rules_topics.dlq)
  # Where Pub/Sub sends pushes the limiter keeps failing.
  push_dead_letter_topic = "${var.name}-push-dead-letter"

  queue_ids = [for index in range(var.tasks_queue_count) : "${var.name}-${index}"]

  # Cloud Run URLs are known before the services exist, so each service can name the other.
  limiter_name    = "${var.name}-limiter"
  dispatcher_name = "${var.name}-dispatcher"
  admin_name      = "${var.name}-admin"
  console_name    = "${var.name}-console"
  limiter_url     = "https://${local.limiter_name}-${data.google_project.this.number}.${var.region}.run.app"
  dispatcher_url  = "https://${local.dispatcher_name}-${data.google_project.this.number}.${var.region}.run.app"
  admin_url       = "https://${local.admin_name}-${data.google_project.this.number}.${var.region}.run.app"
  console_url     = "https://${local.console_name}-${data.google_project.this.number}.${var.region}.run.app"
  # The operator console is deployed once someone may act in it.
  console_enabled = length(var.console_operators) > 0

  # The services' accounts, by role: each reads the secrets, writes metrics and (on a cluster)
  # connects to Redis.
  service_members = {
    limiter    = google_service_account.limiter.member
    dispatcher = google_service_account.dispatcher.member
    admin      = google_service_account.admin.member
  }

  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  labels = merge({ "managed-by" = "terraform", "app" = "drip" }, var.labels)
}

data "google_project" "this" {
  project_id = var.project_id
}

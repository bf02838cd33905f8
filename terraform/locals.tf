locals {
  rules_document = yamldecode(file(var.rules_file))
  rules          = local.rules_document.rules

  # Topics named by id in the rules are created here; full names (projects/.../topics/...) are
  # someone else's and only granted to.
  forward_topics  = toset([for rule in local.rules : rule.forward.topic if can(rule.forward.topic) && !startswith(try(rule.forward.topic, ""), "projects/")])
  overflow_topics = toset([for rule in local.rules : rule.overflow_topic if !startswith(rule.overflow_topic, "projects/")])
  dlq_topics = toset([
    for topic in concat([for rule in local.rules : try(rule.dlq_topic, "")], [try(local.rules_document.default_dlq_topic, "")]) :
    topic if topic != "" && !startswith(topic, "projects/")
  ])
  # Where Pub/Sub sends pushes the limiter keeps failing.
  push_dead_letter_topic = "${var.name}-push-dead-letter"

  queue_ids = [for index in range(var.tasks_queue_count) : "${var.name}-${index}"]

  # Cloud Run URLs are known before the services exist, so each service can name the other.
  limiter_name    = "${var.name}-limiter"
  dispatcher_name = "${var.name}-dispatcher"
  limiter_url     = "https://${local.limiter_name}-${data.google_project.this.number}.${var.region}.run.app"
  dispatcher_url  = "https://${local.dispatcher_name}-${data.google_project.this.number}.${var.region}.run.app"

  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  labels = merge({ "managed-by" = "terraform", "app" = "drip" }, var.labels)
}

data "google_project" "this" {
  project_id = var.project_id
}

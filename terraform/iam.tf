# One service account per role, each with only what it needs.

resource "google_service_account" "limiter" {
  project      = var.project_id
  account_id   = "${var.name}-limiter"
  display_name = "Drip limiter (reserves slots, forwards, creates tasks)"
}

resource "google_service_account" "dispatcher" {
  project      = var.project_id
  account_id   = "${var.name}-dispatcher"
  display_name = "Drip dispatcher (publishes due events to overflow topics)"
}

resource "google_service_account" "admin" {
  project      = var.project_id
  account_id   = "${var.name}-admin"
  display_name = "Drip admin service (inspect, limits, pauses and feedback for operators)"
}

# The identity operators call the admin service as: a person with Token Creator on it (var.operators)
# mints its ID tokens with `gcloud auth print-identity-token --impersonate-service-account`.
resource "google_service_account" "operator" {
  project      = var.project_id
  account_id   = "${var.name}-operator"
  display_name = "Drip operator (who people act as on the admin service)"
}

resource "google_service_account" "push" {
  project      = var.project_id
  account_id   = "${var.name}-push"
  display_name = "Drip push invoker (identity of Pub/Sub pushes to the limiter)"
}

resource "google_service_account" "tasks" {
  project      = var.project_id
  account_id   = "${var.name}-tasks"
  display_name = "Drip tasks invoker (identity of Cloud Tasks calls to the dispatcher)"
}

# Pub/Sub pushes as the push account, Cloud Tasks calls as the tasks account: each may invoke
# exactly one service.
resource "google_cloud_run_v2_service_iam_member" "push_invokes_limiter" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.drip["limiter"].name
  role     = "roles/run.invoker"
  member   = google_service_account.push.member
}

# Operators (as the operator account) and their automation (var.limits_api_callers) may invoke the
# admin service, and no other; Drip's per-route callers then decide which routes.
resource "google_cloud_run_v2_service_iam_member" "operator_invokes_admin" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.drip["admin"].name
  role     = "roles/run.invoker"
  member   = google_service_account.operator.member
}

resource "google_cloud_run_v2_service_iam_member" "limits_callers_invoke_admin" {
  for_each = toset(var.limits_api_callers)

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.drip["admin"].name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${each.value}"
}

# The people (user:, group:) who may act as the operator account: Token Creator on that one
# account lets them mint its ID tokens, nothing more.
resource "google_service_account_iam_member" "operators_mint_operator_tokens" {
  for_each = toset(var.operators)

  service_account_id = google_service_account.operator.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = each.value
}

resource "google_cloud_run_v2_service_iam_member" "tasks_invoke_dispatcher" {
  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.drip["dispatcher"].name
  role     = "roles/run.invoker"
  member   = google_service_account.tasks.member
}

# The Pub/Sub service agent mints the push account's OIDC tokens: Token Creator on that one
# account, not on the project.
resource "google_service_account_iam_member" "agent_signs_push_tokens" {
  service_account_id = google_service_account.push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# The limiter creates tasks on its queues that act as the tasks account.
resource "google_cloud_tasks_queue_iam_member" "limiter_enqueues" {
  for_each = google_cloud_tasks_queue.drip

  project  = var.project_id
  location = var.region
  name     = each.value.name
  role     = "roles/cloudtasks.enqueuer"
  member   = google_service_account.limiter.member
}

resource "google_service_account_iam_member" "limiter_acts_as_tasks" {
  service_account_id = google_service_account.tasks.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.limiter.member
}

# The dispatcher gives an event a new slot in a new task when a rule's `overflow: { url }` target
# answers 429 or 503 (docs/design.md: "Overflow to an HTTP target").
resource "google_cloud_tasks_queue_iam_member" "dispatcher_enqueues" {
  for_each = google_cloud_tasks_queue.drip

  project  = var.project_id
  location = var.region
  name     = each.value.name
  role     = "roles/cloudtasks.enqueuer"
  member   = google_service_account.dispatcher.member
}

resource "google_service_account_iam_member" "dispatcher_acts_as_tasks" {
  service_account_id = google_service_account.tasks.name
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.dispatcher.member
}

# Publishers on exactly the topics each service writes to.
resource "google_pubsub_topic_iam_member" "limiter_publishes" {
  for_each = merge(google_pubsub_topic.forward, google_pubsub_topic.dlq)

  project = var.project_id
  topic   = each.value.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.limiter.member
}

resource "google_pubsub_topic_iam_member" "dispatcher_publishes" {
  for_each = merge(google_pubsub_topic.overflow, google_pubsub_topic.dlq)

  project = var.project_id
  topic   = each.value.name
  role    = "roles/pubsub.publisher"
  member  = google_service_account.dispatcher.member
}

# The collector sidecars write the services' metrics to Cloud Monitoring as the services'
# accounts. Metric writing is granted per project only (there is no narrower resource).
resource "google_project_iam_member" "services_write_metrics" {
  for_each = local.service_members

  project = var.project_id
  role    = "roles/monitoring.metricWriter"
  member  = each.value
}

# The console behind IAP: IAP's service agent invokes the service (Cloud Run's invoker check after
# IAP's), and the people of console_operators and console_viewers may pass IAP. Which of them may
# act is the console's own check (DRIP_CONSOLE_OPERATORS).
resource "google_cloud_run_v2_service_iam_member" "iap_invokes_console" {
  count = local.console_enabled ? 1 : 0

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.drip["console"].name
  role     = "roles/run.invoker"
  member   = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-iap.iam.gserviceaccount.com"
}

resource "google_iap_web_cloud_run_service_iam_member" "console_users" {
  for_each = local.console_enabled ? toset(concat(var.console_operators, var.console_viewers)) : toset([])

  project                = var.project_id
  location               = var.region
  cloud_run_service_name = google_cloud_run_v2_service.drip["console"].name
  role                   = "roles/iap.httpsResourceAccessor"
  member                 = "user:${each.value}"
}

# The console's dead-letters page reads the dead-letter subscriptions and replays their events to
# the source topics, as the admin service's account (the console service runs as it).
resource "google_pubsub_subscription_iam_member" "console_reads_dead_letters" {
  for_each = local.console_enabled ? google_pubsub_subscription.dlq : {}

  project      = var.project_id
  subscription = each.value.name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.admin.member
}

resource "google_pubsub_topic_iam_member" "console_replays_to_sources" {
  for_each = local.console_enabled ? toset(var.source_topics) : toset([])

  project = var.project_id
  topic   = each.value
  role    = "roles/pubsub.publisher"
  member  = google_service_account.admin.member
}

output "limiter_url" {
  description = "URL of the limiter (push endpoint: <url>/push)."
  value       = google_cloud_run_v2_service.drip["limiter"].uri
}

output "dispatcher_url" {
  description = "URL of the dispatcher (Cloud Tasks call <url>/dispatch)."
  value       = google_cloud_run_v2_service.drip["dispatcher"].uri
}

output "admin_url" {
  description = "URL of the admin service, the operators' door (drip inspect/limits/resume/feedback --api <url>)."
  value       = google_cloud_run_v2_service.drip["admin"].uri
}

output "console_url" {
  description = "URL of the operator console behind IAP (<url>/console in a browser), when console_operators is set."
  value       = local.console_enabled ? "${google_cloud_run_v2_service.drip["console"].uri}/console" : null
}

output "queues" {
  description = "Full names of the Cloud Tasks queues."
  value       = [for queue in google_cloud_tasks_queue.drip : queue.id]
}

output "push_subscriptions" {
  description = "Push subscriptions of the source topics, by topic."
  value       = { for topic, subscription in google_pubsub_subscription.push : topic => subscription.id }
}

output "dlq_subscriptions" {
  description = "Pull subscriptions of the dead-letter topics, by topic: where dead-lettered events wait."
  value       = { for topic, subscription in google_pubsub_subscription.dlq : topic => subscription.id }
}

output "service_accounts" {
  description = "Emails of the service accounts, by role."
  value = {
    limiter    = google_service_account.limiter.email
    dispatcher = google_service_account.dispatcher.email
    push       = google_service_account.push.email
    tasks      = google_service_account.tasks.email
    admin      = google_service_account.admin.email
    operator   = google_service_account.operator.email
  }
}

output "redis_host" {
  description = "Address of Memorystore (the AUTH string stays in Secret Manager)."
  value       = var.redis_cluster ? google_redis_cluster.drip[0].discovery_endpoints[0].address : google_redis_instance.drip[0].host
}

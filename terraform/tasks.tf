# The queues that hold delayed events until their slot. Keys are sharded over them by hash, since
# one queue dispatches at most 500 tasks a second.

resource "google_cloud_tasks_queue" "drip" {
  for_each = toset(local.queue_ids)

  project  = var.project_id
  location = var.region
  name     = each.value

  rate_limits {
    max_dispatches_per_second = var.tasks_max_dispatches_per_second
    max_concurrent_dispatches = 1000
  }

  retry_config {
    max_attempts       = var.tasks_max_attempts
    min_backoff        = "1s"
    max_backoff        = "300s"
    max_doublings      = 8
    max_retry_duration = "0s"
  }

  stackdriver_logging_config {
    sampling_ratio = 0.1
  }

  # A deleted queue's name cannot be reused for 7 days, and its tasks are events not yet sent.
  lifecycle {
    prevent_destroy = true
  }
}

# The Cloud Run services: the limiter and the dispatcher with internal ingress (Pub/Sub and Cloud
# Tasks of this project count as internal), and the admin service, the operators' door from a
# laptop: the limiter's binary serving only its admin and feedback routes (never /push), reachable
# from the internet by Google-authenticated callers that hold run.invoker on it. With
# console_operators, a fourth: the console service, the same binary serving the operator console
# alone, behind Identity-Aware Proxy (people in a browser). No service allows unauthenticated
# access; each has Direct VPC egress to Memorystore and a startup probe on /readyz.

locals {
  # Each service serves /metrics, unauthenticated, on 127.0.0.1 at this port: only the collector
  # sidecar of the same instance reaches it (Cloud Run exposes the ingress port alone).
  metrics_port = 9464
  # The collector's RunMonitoring config (a Secret Manager secret, mounted at /etc/rungmp).
  run_monitoring = yamlencode({
    apiVersion = "monitoring.googleapis.com/v1beta"
    kind       = "RunMonitoring"
    metadata   = { name = var.name }
    spec = {
      endpoints = [{ port = local.metrics_port, path = "/metrics", interval = "30s" }]
    }
  })
  common_env = {
    GOOGLE_CLOUD_PROJECT = var.project_id
    DRIP_METRICS_PORT    = tostring(local.metrics_port)
    DRIP_RULES           = "/etc/drip/rules/rules.yaml"
    REDIS_CA_CERT        = "/etc/drip/redis-ca/ca.pem"
    REDIS_CLUSTER        = tostring(var.redis_cluster)
    REDIS_IAM_AUTH       = tostring(var.redis_cluster)
    DRIP_REDIS_NAMESPACE = "drip"
    # The rules volume reads Secret Manager's latest version: a new version applies within this
    # long, without a new revision (docs/rules.md: "Changing limits").
    DRIP_RULES_POLL_MS = "10000"
  }
  # Both create tasks: the limiter for each delayed event, the dispatcher for an event an
  # `overflow: { url }` target told to wait.
  tasks_env = {
    DRIP_TASKS_QUEUES          = join(",", [for queue in google_cloud_tasks_queue.drip : queue.id])
    DRIP_TASKS_LOCATION        = var.region
    DRIP_DISPATCHER_URL        = "${local.dispatcher_url}/dispatch"
    DRIP_TASKS_SERVICE_ACCOUNT = google_service_account.tasks.email
    DRIP_TASKS_AUDIENCE        = local.dispatcher_url
    # A sealed task expires this long after its slot: every attempt at the queues' longest
    # backoff (300 s), and an hour.
    DRIP_TASKS_RETRY_SPAN_MS = tostring((var.tasks_max_attempts * 300 + 3600) * 1000)
    DRIP_TASK_BATCH_MAX      = tostring(var.task_batch_max)
  }
  # Each route class has its own callers: the push subscriptions' account may only push, operators
  # may only inspect and change limits (on the admin service), overflow consumers may only report
  # feedback. The limiter serves no admin route: operators reach those through the admin service.
  limiter_env = merge(local.common_env, local.tasks_env, {
    DRIP_ROUTES           = "push,feedback"
    DRIP_AUTH             = "oidc"
    DRIP_OIDC_AUDIENCE    = local.limiter_url
    DRIP_PUSH_CALLERS     = google_service_account.push.email
    DRIP_FEEDBACK_CALLERS = join(",", var.feedback_callers)
  })
  # The operators' door: admin and feedback routes only (DRIP_ROUTES has no push), behind Cloud
  # Run's invoker check and Drip's own per-route callers. Operators call as the operator account
  # (`gcloud auth print-identity-token --impersonate-service-account`), automation as itself.
  # It creates no task, so it gets neither the queues nor the task signing key.
  admin_env = merge(local.common_env, {
    DRIP_ROUTES           = "admin,feedback"
    DRIP_AUTH             = "oidc"
    DRIP_OIDC_AUDIENCE    = local.admin_url
    DRIP_ADMIN_CALLERS    = join(",", concat([google_service_account.operator.email], var.limits_api_callers))
    DRIP_FEEDBACK_CALLERS = join(",", concat([google_service_account.operator.email], var.feedback_callers))
  })
  # The console: people in a browser, named by IAP's signed header (which the console verifies
  # against the service's audience); IAP replaces the caller's identity, so the API and its ID
  # tokens stay on the admin service and this one serves the console alone.
  console_env = merge(local.common_env, {
    DRIP_ROUTES            = "console"
    DRIP_AUTH              = "oidc"
    DRIP_OIDC_AUDIENCE     = local.console_url
    DRIP_IAP_AUDIENCE      = "/projects/${data.google_project.this.number}/locations/${var.region}/services/${local.console_name}"
    DRIP_CONSOLE_OPERATORS = join(",", var.console_operators)
    DRIP_CONSOLE_VIEWERS   = join(",", var.console_viewers)
    # Its dead-letters page: what it reads, and where it may replay to.
    DRIP_CONSOLE_DLQ_SUBSCRIPTIONS = join(",", [for s in google_pubsub_subscription.dlq : s.name])
    DRIP_CONSOLE_REPLAY_TOPICS     = join(",", var.source_topics)
  })
  dispatcher_env = merge(local.common_env, local.tasks_env, {
    DRIP_AUTH               = "oidc"
    DRIP_OIDC_AUDIENCE      = local.dispatcher_url
    DRIP_TASK_CALLERS       = google_service_account.tasks.email
    DRIP_TASKS_MAX_ATTEMPTS = tostring(var.tasks_max_attempts)
  })
  services = {
    limiter = {
      name          = local.limiter_name
      command       = "/usr/local/bin/drip-limiter"
      account       = google_service_account.limiter.email
      env           = local.limiter_env
      min_instances = var.limiter_min_instances
      max_instances = var.limiter_max_instances
      timeout       = "${var.push_ack_deadline_seconds}s"
      ingress       = "INGRESS_TRAFFIC_INTERNAL_ONLY"
      # Inline waits and Redis calls should not wait for CPU to be allocated.
      cpu_idle = false
      iap      = false
      enabled  = true
    }
    dispatcher = {
      name          = local.dispatcher_name
      command       = "/usr/local/bin/drip-dispatcher"
      account       = google_service_account.dispatcher.email
      env           = local.dispatcher_env
      min_instances = var.dispatcher_min_instances
      max_instances = var.dispatcher_max_instances
      timeout       = "60s"
      ingress       = "INGRESS_TRAFFIC_INTERNAL_ONLY"
      cpu_idle      = true
      iap           = false
      enabled       = true
    }
    admin = {
      name          = local.admin_name
      command       = "/usr/local/bin/drip-limiter"
      account       = google_service_account.admin.email
      env           = local.admin_env
      min_instances = 0
      max_instances = 2
      timeout       = "60s"
      # Operators on laptops are on the internet; the invoker check (IAM) and Drip's per-route
      # callers stand in front of every route, and /push is not served here.
      ingress  = "INGRESS_TRAFFIC_ALL"
      cpu_idle = true
      iap      = false
      enabled  = true
    }
    console = {
      name          = local.console_name
      command       = "/usr/local/bin/drip-limiter"
      account       = google_service_account.admin.email
      env           = local.console_env
      min_instances = 0
      max_instances = 2
      timeout       = "60s"
      # Browsers on the internet, through IAP: it lets only console_operators and console_viewers
      # in, and invokes the service as its own service agent (the one invoker grant here).
      ingress  = "INGRESS_TRAFFIC_ALL"
      cpu_idle = true
      iap      = true
      enabled  = local.console_enabled
    }
  }
}

resource "google_cloud_run_v2_service" "drip" {
  for_each = { for role, service in local.services : role => service if service.enabled }

  project             = var.project_id
  location            = var.region
  name                = each.value.name
  ingress             = each.value.ingress
  iap_enabled         = each.value.iap
  deletion_protection = var.deletion_protection
  labels              = local.labels

  template {
    service_account                  = each.value.account
    max_instance_request_concurrency = var.concurrency
    timeout                          = each.value.timeout

    scaling {
      min_instance_count = each.value.min_instances
      max_instance_count = each.value.max_instances
    }

    vpc_access {
      egress = "PRIVATE_RANGES_ONLY"
      network_interfaces {
        network    = var.network
        subnetwork = var.subnetwork
      }
    }

    containers {
      name    = "drip"
      image   = var.image
      command = [each.value.command]

      # The ingress container: exactly one container of a revision declares a port (Cloud Run
      # refuses a multi-container revision without one). Cloud Run sets PORT to it.
      ports {
        container_port = 8080
      }

      resources {
        limits = {
          cpu    = var.cpu
          memory = var.memory
        }
        cpu_idle = each.value.cpu_idle
      }

      dynamic "env" {
        for_each = each.value.env
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = { REDIS_URL = "redis_url" }
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = google_secret_manager_secret.drip[env.value].secret_id
              version = google_secret_manager_secret_version.drip[env.value].version
            }
          }
        }
      }

      # DRIP_TASK_SIGNING_KEY (and DRIP_TASK_SIGNING_KEY_PREVIOUS during a rotation) from the
      # secret made outside Terraform; the admin service makes no task and holds no key.
      dynamic "env" {
        for_each = contains(["admin", "console"], each.key) ? {} : local.signing_key_env
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = var.task_signing_key_secret
              version = env.value
            }
          }
        }
      }

      startup_probe {
        period_seconds    = 2
        failure_threshold = 30
        http_get {
          path = "/readyz"
        }
      }

      liveness_probe {
        period_seconds = 15
        http_get {
          path = "/healthz"
        }
      }

      volume_mounts {
        name       = "rules"
        mount_path = "/etc/drip/rules"
      }

      volume_mounts {
        name       = "redis-ca"
        mount_path = "/etc/drip/redis-ca"
      }
    }

    # Managed Service for Prometheus: scrapes the metrics listener over localhost every 30 s (and
    # once more at shutdown) and writes to Cloud Monitoring as the service's account. The
    # dispatcher keeps request-based billing (cpu_idle): a scrape between requests may be skipped,
    # the shutdown scrape still flushes; the limiter's CPU is always allocated.
    containers {
      name       = "collector"
      image      = var.prometheus_sidecar_image
      depends_on = ["drip"]

      resources {
        limits = {
          cpu    = var.collector_cpu
          memory = var.collector_memory
        }
      }

      volume_mounts {
        name       = "run-monitoring"
        mount_path = "/etc/rungmp"
      }
    }

    volumes {
      name = "rules"
      secret {
        secret = google_secret_manager_secret.drip["rules"].secret_id
        # `latest`, not the version Terraform wrote: Cloud Run fetches the secret when the file is
        # read, so `gcloud secrets versions add` (or the next apply) changes the rules in place.
        items {
          version = "latest"
          path    = "rules.yaml"
        }
      }
    }

    volumes {
      name = "run-monitoring"
      secret {
        secret = google_secret_manager_secret.drip["run_monitoring"].secret_id
        items {
          version = google_secret_manager_secret_version.drip["run_monitoring"].version
          path    = "config.yaml"
        }
      }
    }

    volumes {
      name = "redis-ca"
      secret {
        secret = google_secret_manager_secret.drip["redis_ca"].secret_id
        items {
          version = google_secret_manager_secret_version.drip["redis_ca"].version
          path    = "ca.pem"
        }
      }
    }
  }

  # The secrets' versions must exist before a revision reads them (the rules volume names `latest`).
  depends_on = [
    google_secret_manager_secret_iam_member.services_read,
    google_secret_manager_secret_iam_member.services_read_signing_key,
    google_secret_manager_secret_version.drip,
    google_project_iam_member.services_write_metrics,
  ]
}

variable "project_id" {
  description = "Project that holds Drip: topics, queues, Memorystore and the Cloud Run services."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a valid Google Cloud project id."
  }
}

variable "region" {
  description = "Region of the Cloud Run services, the Cloud Tasks queues and Memorystore."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name (services, queues, service accounts, secrets)."
  type        = string
  default     = "drip"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,18}[a-z0-9]$", var.name))
    error_message = "name must be 3-20 characters of a-z, 0-9 and -, starting with a letter."
  }
}

variable "image" {
  description = "Container image holding both binaries (drip-limiter and drip-dispatcher), e.g. REGION-docker.pkg.dev/PROJECT/drip/drip:TAG."
  type        = string
}

variable "prometheus_sidecar_image" {
  description = "Google's Managed Service for Prometheus collector for Cloud Run, run beside each service: it scrapes the service's metrics listener (127.0.0.1:local.metrics_port) and writes to Cloud Monitoring."
  type        = string
  default     = "us-docker.pkg.dev/cloud-ops-agents-artifacts/cloud-run-gmp-sidecar/cloud-run-gmp-sidecar:1.2.0"
}

variable "rules_file" {
  description = "Path of the rules file (docs/rules.md). It reaches the services through Secret Manager; its topics come from rules_topics_file."
  type        = string

  validation {
    condition     = fileexists(var.rules_file)
    error_message = "rules_file must name an existing file."
  }
}

variable "rules_topics_file" {
  description = "Path of what `drip rules topics RULES_FILE --output json` prints for rules_file: its forward, overflow and dead-letter topics in this project, created here (and full names of other projects' topics, left alone). Drip reads the rules, so Terraform parses no YAML; cloudbuild.yaml writes it with the image it built."
  type        = string

  validation {
    condition     = fileexists(var.rules_topics_file) && alltrue([for kind in ["forward", "overflow", "dlq", "external"] : can(jsondecode(file(var.rules_topics_file))[kind])])
    error_message = "rules_topics_file must name the JSON of `drip rules topics RULES_FILE --output json` (forward, overflow, dlq and external)."
  }
}

variable "source_topics" {
  description = "Topic ids the rules listen on: each gets a push subscription to the limiter."
  type        = list(string)

  validation {
    condition     = length(var.source_topics) > 0
    error_message = "At least one source topic is needed."
  }
}

variable "create_source_topics" {
  description = "Create the source topics too (false when the publishing teams own them)."
  type        = bool
  default     = false
}

variable "create_consumer_subscriptions" {
  description = "Create a pull subscription on every forward and overflow topic, so no message is published to a topic nobody reads. Set false when the consuming teams create their own."
  type        = bool
  default     = true
}

variable "network" {
  description = "VPC network (self link or id) that reaches Memorystore; the services use Direct VPC egress into it."
  type        = string
}

variable "subnetwork" {
  description = "Subnetwork of var.network for the services' Direct VPC egress."
  type        = string
}

variable "tasks_queue_count" {
  description = "Cloud Tasks queues to shard delayed events over (a queue dispatches at most 500 tasks/s). Removing queues is refused: a deleted queue name is blocked for 7 days."
  type        = number
  default     = 2

  validation {
    condition     = var.tasks_queue_count >= 1 && var.tasks_queue_count <= 100
    error_message = "tasks_queue_count must be between 1 and 100."
  }
}

variable "tasks_max_dispatches_per_second" {
  description = "Dispatch rate cap of each queue (at most 500)."
  type        = number
  default     = 500

  validation {
    condition     = var.tasks_max_dispatches_per_second > 0 && var.tasks_max_dispatches_per_second <= 500
    error_message = "tasks_max_dispatches_per_second must be in (0, 500]."
  }
}

variable "task_batch_max" {
  description = "The most delayed events one Cloud Task carries (DRIP_TASK_BATCH_MAX): the limiter's delayed events of one queue and 1 s bucket that arrive together share a task. 1 gives every event its own task, as versions before batching did: set it while upgrading from one, until the new dispatcher runs everywhere."
  type        = number
  default     = 500

  validation {
    condition     = var.task_batch_max >= 1 && var.task_batch_max == floor(var.task_batch_max)
    error_message = "task_batch_max must be a whole number of at least 1."
  }
}

variable "tasks_max_attempts" {
  description = "Dispatch attempts of a task before Cloud Tasks gives up. The dispatcher is told the same number (DRIP_TASKS_MAX_ATTEMPTS) and dead-letters a task that fails on its last attempt, so none is deleted silently."
  type        = number
  default     = 100

  validation {
    condition     = var.tasks_max_attempts >= 2
    error_message = "tasks_max_attempts must be at least 2 (unlimited attempts would never dead-letter a task that keeps failing)."
  }
}

variable "task_signing_key_secret" {
  description = "The Secret Manager secret (id in this project) holding the key with which the limiter seals tasks and the dispatcher checks them (at least 32 characters, e.g. `openssl rand -hex 32 | gcloud secrets versions add ID --data-file=-`). Made outside Terraform, so the key never enters its state; the services read its versions."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,255}$", var.task_signing_key_secret))
    error_message = "task_signing_key_secret must be a secret id (letters, digits, - and _)."
  }
}

variable "task_signing_key_version" {
  description = "The version of task_signing_key_secret the services seal with (\"latest\", or a number to pin it). A new revision reads it."
  type        = string
  default     = "latest"
}

variable "task_signing_key_previous_version" {
  description = "During a key rotation, the version of task_signing_key_secret that sealed the tasks still waiting in the queues: still accepted, never used to seal (docs/operations.md: \"Rotating the task signing key\"). null once they are gone."
  type        = string
  default     = null

  validation {
    condition     = var.task_signing_key_previous_version == null || can(regex("^[0-9]+$", var.task_signing_key_previous_version))
    error_message = "task_signing_key_previous_version must be a version number."
  }
}

variable "redis_memory_alert_ratio" {
  description = "Alert when Redis memory use passes this fraction of its maximum (Redis runs with noeviction: when full, writes fail and pushes are answered 503)."
  type        = number
  default     = 0.8

  validation {
    condition     = var.redis_memory_alert_ratio > 0 && var.redis_memory_alert_ratio < 1
    error_message = "redis_memory_alert_ratio must be between 0 and 1."
  }
}

variable "redis_tier" {
  description = "Memorystore for Redis tier: STANDARD_HA (replicated, the default for money flows) or BASIC."
  type        = string
  default     = "STANDARD_HA"

  validation {
    condition     = contains(["STANDARD_HA", "BASIC"], var.redis_tier)
    error_message = "redis_tier must be STANDARD_HA or BASIC."
  }
}

variable "redis_memory_size_gb" {
  description = "Memorystore for Redis size. State is O(limits) per active entity: 1 GB holds millions of entities."
  type        = number
  default     = 1
}

variable "create_service_connection_policy" {
  description = "With redis_cluster: create the network's Private Service Connect service connection policy for Memorystore (service class gcp-memorystore-redis) in the region. Set false when the network's admins already made one (one per network, region and service class)."
  type        = bool
  default     = true
}

variable "redis_cluster" {
  description = "Use Memorystore for Redis Cluster (IAM authentication, TLS) instead of Memorystore for Redis."
  type        = bool
  default     = false
}

variable "redis_cluster_shard_count" {
  description = "Shards of the Redis Cluster, when redis_cluster is true."
  type        = number
  default     = 3
}

variable "limiter_min_instances" {
  description = "Instances of the limiter kept warm (a cold start delays pushes)."
  type        = number
  default     = 1
}

variable "limiter_max_instances" {
  description = "Upper bound of limiter instances."
  type        = number
  default     = 20
}

variable "dispatcher_min_instances" {
  description = "Instances of the dispatcher kept warm (a cold start adds to dispatch lateness)."
  type        = number
  default     = 1
}

variable "dispatcher_max_instances" {
  description = "Upper bound of dispatcher instances."
  type        = number
  default     = 20
}

variable "concurrency" {
  description = "Requests one instance serves at once (Cloud Run allows up to 1000)."
  type        = number
  default     = 250

  validation {
    condition     = var.concurrency >= 1 && var.concurrency <= 1000
    error_message = "concurrency must be between 1 and 1000."
  }
}

variable "cpu" {
  description = "CPU limit of each instance."
  type        = string
  default     = "1"
}

variable "memory" {
  description = "Memory limit of each instance."
  type        = string
  default     = "512Mi"
}

variable "collector_cpu" {
  description = "CPU limit of the metrics collector sidecar beside each service. With the limiter's instance-based billing it is paid around the clock: docs/capacity.md, \"The smallest deployment\"."
  type        = string
  default     = "1"
}

variable "collector_memory" {
  description = "Memory limit of the metrics collector sidecar beside each service."
  type        = string
  default     = "512Mi"
}

variable "push_ack_deadline_seconds" {
  description = "Ack deadline of the push subscriptions: the limiter's request timeout (it includes inline waits)."
  type        = number
  default     = 60

  validation {
    condition     = var.push_ack_deadline_seconds >= 10 && var.push_ack_deadline_seconds <= 600
    error_message = "push_ack_deadline_seconds must be between 10 and 600."
  }
}

variable "push_max_delivery_attempts" {
  description = "Deliveries of a message the limiter keeps failing before Pub/Sub dead-letters it."
  type        = number
  default     = 20

  validation {
    condition     = var.push_max_delivery_attempts >= 5 && var.push_max_delivery_attempts <= 100
    error_message = "push_max_delivery_attempts must be between 5 and 100."
  }
}

variable "notification_channels" {
  description = "Monitoring notification channel ids for the max_delay_exceeded, DLQ backlog, Redis memory and refused-rules alerts."
  type        = list(string)
  default     = []
}

variable "dlq_backlog_threshold" {
  description = "Undelivered dead-lettered messages above which the DLQ alert fires."
  type        = number
  default     = 0
}

variable "deletion_protection" {
  description = "Protect the Cloud Run services from terraform destroy."
  type        = bool
  default     = true
}

variable "topic_kms_key_name" {
  description = "Cloud KMS key (projects/.../cryptoKeys/...) to encrypt the topics Drip creates; null for Google-managed encryption. The Pub/Sub service agent needs roles/cloudkms.cryptoKeyEncrypterDecrypter on it."
  type        = string
  default     = null
}

variable "labels" {
  description = "Labels set on every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "operators" {
  description = "People who may act as the operator account on the admin service (IAM members: \"user:alice@example.com\", \"group:sre@example.com\"): they get Token Creator on that one account, and reach inspect, limits, pauses and feedback from a laptop with gcloud (docs/operations.md: \"Reaching production\")."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for member in var.operators : can(regex("^(user|group|serviceAccount|domain):", member))])
    error_message = "Each operator is an IAM member: user:EMAIL, group:EMAIL, serviceAccount:EMAIL or domain:DOMAIN."
  }
}

variable "console_operators" {
  description = "People (Google account emails) who may act in the operator console: pause, resume and override keys and budgets (docs/operations.md: \"The console\"). Non-empty: the console service is deployed behind Identity-Aware Proxy (the project needs iap.googleapis.com and an OAuth consent screen) and they may pass IAP."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for email in concat(var.console_operators, var.console_viewers) : can(regex("^[^:@\\s]+@[^:@\\s]+$", email))])
    error_message = "Each console user is an email (alice@example.com), not an IAM member (no user: prefix)."
  }
}

variable "console_viewers" {
  description = "People (Google account emails) who may look at the operator console and act in none of it."
  type        = list(string)
  default     = []
}

variable "limits_api_callers" {
  description = "Service accounts (emails) of automation allowed to inspect keys and change their limits through the admin service's /v1/rules/{rule}/keys/{key}[/limits] (docs/rules.md: \"Changing limits\"), and only that: they may invoke the admin service, and its OIDC check lets them on those routes alone. Each change is logged and audited with the caller's email."
  type        = list(string)
  default     = []
}

variable "feedback_callers" {
  description = "Service accounts (emails) of overflow consumers allowed to report a downstream's answers through the limiter's POST /v1/feedback, and only that. Each report is audited with the caller's email."
  type        = list(string)
  default     = []
}

variable "push_lag_threshold_seconds" {
  description = "Alert when a push subscription's oldest unacked message is older than this (seconds) for 5 minutes."
  type        = number
  default     = 300
}

variable "limiter_error_ratio" {
  description = "Alert when more than this share of the limiter's requests end in 5xx for 10 minutes (a few 503s are normal: Pub/Sub redelivers them)."
  type        = number
  default     = 0.05
}

variable "drain_alert_fraction" {
  description = "Alert when a rule's p99 delay exceeds this fraction of its max_delay for 5 minutes: its slowest keys are about to be dead-lettered."
  type        = number
  default     = 0.8
}

# Drip for the payouts and SMS rules of rules.yaml, listening on two source topics. Its state lives
# in a GCS bucket (made once: docs/operations.md, "Deploying"), the same one Cloud Build plans with,
# and its variables in terraform.tfvars beside this file, which Terraform reads by itself wherever
# it runs (Cloud Build or a laptop): only the image's tag is given on the command line.
#   terraform init -backend-config=bucket=my-project-drip-tfstate -backend-config=prefix=drip
#   terraform apply -var image_tag=$(git rev-parse --short HEAD)

terraform {
  required_version = ">= 1.6.0, < 2.0.0"

  # Partial configuration: the bucket (and prefix) come from -backend-config at init.
  backend "gcs" {}

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 8.7"
    }
  }
}

variable "project_id" {
  description = "Project to deploy Drip into."
  type        = string
}

variable "region" {
  description = "Region of Drip."
  type        = string
  default     = "europe-west1"
}

variable "name" {
  description = "Prefix of every resource the module names (services, queues, accounts, secrets)."
  type        = string
  default     = "drip"
}

variable "labels" {
  description = "Labels on every resource that takes them (./run verify-gcp marks its run's so)."
  type        = map(string)
  default     = {}
}

variable "image_tag" {
  description = "Tag of the image cloudbuild.yaml pushed."
  type        = string
}

variable "task_signing_key_secret" {
  description = "The secret holding the task signing key, made once outside Terraform: gcloud secrets create drip-task-signing-key && openssl rand -hex 32 | gcloud secrets versions add drip-task-signing-key --data-file=-"
  type        = string
  default     = "drip-task-signing-key"
}

variable "operators" {
  description = "People who may act as the operator account on the admin service (user:EMAIL, group:EMAIL)."
  type        = list(string)
  default     = []
}

variable "console_operators" {
  description = "People (emails) who may act in the operator console behind IAP; empty: no console service."
  type        = list(string)
  default     = []
}

variable "console_viewers" {
  description = "People (emails) who may only look at the operator console."
  type        = list(string)
  default     = []
}

variable "notification_channels" {
  description = "Monitoring notification channels for Drip's alerts."
  type        = list(string)
  default     = []
}

provider "google" {
  project = var.project_id
  region  = var.region
}

module "drip" {
  source = "../.."

  project_id              = var.project_id
  region                  = var.region
  name                    = var.name
  labels                  = var.labels
  image                   = "${var.region}-docker.pkg.dev/${var.project_id}/drip/drip:${var.image_tag}"
  rules_file              = "${path.module}/rules.yaml"
  rules_topics_file       = "${path.module}/rules-topics.json"
  source_topics           = ["payout-events", "sms-events"]
  create_source_topics    = true
  network                 = "projects/${var.project_id}/global/networks/default"
  subnetwork              = "projects/${var.project_id}/regions/${var.region}/subnetworks/default"
  tasks_queue_count       = 2
  task_signing_key_secret = var.task_signing_key_secret
  notification_channels   = var.notification_channels
  operators               = var.operators
  console_operators       = var.console_operators
  console_viewers         = var.console_viewers
}

output "console_url" {
  description = "The operator console in a browser, behind IAP (when console_operators is set)."
  value       = module.drip.console_url
}

output "admin_url" {
  description = "The admin service's URL: drip inspect/limits/resume/feedback --api <url>."
  value       = module.drip.admin_url
}

output "operator_service_account" {
  description = "The account operators act as: gcloud auth print-identity-token --impersonate-service-account=<it> --audiences=<admin_url> --include-email."
  value       = module.drip.service_accounts["operator"]
}

output "limiter_url" {
  description = "The limiter's URL."
  value       = module.drip.limiter_url
}

output "dlq_subscriptions" {
  description = "Where dead-lettered events wait."
  value       = module.drip.dlq_subscriptions
}

# Secrets the services read at start: the Redis URL (with the AUTH string), the Redis server CA,
# and the rules file (not secret, but versioned with the deployment).

resource "google_secret_manager_secret" "redis_url" {
  project   = var.project_id
  secret_id = "${var.name}-redis-url"
  labels    = local.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "redis_url" {
  secret      = google_secret_manager_secret.redis_url.id
  secret_data = local.redis_url
}

resource "google_secret_manager_secret" "redis_ca" {
  project   = var.project_id
  secret_id = "${var.name}-redis-ca"
  labels    = local.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "redis_ca" {
  secret      = google_secret_manager_secret.redis_ca.id
  secret_data = local.redis_ca
}

resource "google_secret_manager_secret" "rules" {
  project   = var.project_id
  secret_id = "${var.name}-rules"
  labels    = local.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "rules" {
  secret      = google_secret_manager_secret.rules.id
  secret_data = file(var.rules_file)
}

resource "google_secret_manager_secret_iam_member" "services_read" {
  for_each = {
    for pair in setproduct(["redis_url", "redis_ca", "rules"], ["limiter", "dispatcher"]) : "${pair[0]}-${pair[1]}" => {
      secret = pair[0]
      member = pair[1] == "limiter" ? google_service_account.limiter.member : google_service_account.dispatcher.member
    }
  }

  project = var.project_id
  secret_id = {
    redis_url = google_secret_manager_secret.redis_url.secret_id
    redis_ca  = google_secret_manager_secret.redis_ca.secret_id
    rules     = google_secret_manager_secret.rules.secret_id
  }[each.value.secret]
  role   = "roles/secretmanager.secretAccessor"
  member = each.value.member
}

# Secrets the services read: the Redis URL (with the AUTH string), the Redis server CA and the
# rules file (not secret, but versioned; re-read while they run). The task signing key lives in a
# secret made outside Terraform (var.task_signing_key_secret), so its value never enters the state.

locals {
  # The names are listed apart from the values: for_each may not depend on the (sensitive) values.
  secret_names = toset(["redis_url", "redis_ca", "rules", "run_monitoring"])
  secrets = {
    redis_url      = local.redis_url
    redis_ca       = local.redis_ca
    rules          = file(var.rules_file)
    run_monitoring = local.run_monitoring
  }
  # The signing key's versions the services read: the one they seal with, and during a rotation
  # the one that sealed the tasks still queued.
  signing_key_env = merge(
    { DRIP_TASK_SIGNING_KEY = var.task_signing_key_version },
    var.task_signing_key_previous_version == null ? {} : { DRIP_TASK_SIGNING_KEY_PREVIOUS = var.task_signing_key_previous_version },
  )
}

resource "google_secret_manager_secret" "drip" {
  for_each = local.secret_names

  project   = var.project_id
  secret_id = "${var.name}-${replace(each.key, "_", "-")}"
  labels    = local.labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "drip" {
  for_each = local.secret_names

  secret      = google_secret_manager_secret.drip[each.key].id
  secret_data = local.secrets[each.key]
}

resource "google_secret_manager_secret_iam_member" "services_read" {
  for_each = {
    for pair in setproduct(local.secret_names, keys(local.service_members)) : "${pair[0]}-${pair[1]}" => {
      secret = pair[0]
      member = local.service_members[pair[1]]
    }
  }

  project   = var.project_id
  secret_id = google_secret_manager_secret.drip[each.value.secret].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value.member
}

resource "google_secret_manager_secret_iam_member" "services_read_signing_key" {
  # The services that seal or check tasks; not the admin service.
  for_each = { for role, member in local.service_members : role => member if role != "admin" }

  project   = var.project_id
  secret_id = var.task_signing_key_secret
  role      = "roles/secretmanager.secretAccessor"
  member    = each.value
}

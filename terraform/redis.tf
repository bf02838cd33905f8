# Where reservations live. AUTH and in-transit encryption are on; the AUTH string and the server CA
# reach the services through Secret Manager only. Memorystore for Redis Cluster authenticates with
# IAM instead: the services present their own access tokens (REDIS_IAM_AUTH).

resource "google_redis_instance" "drip" {
  count = var.redis_cluster ? 0 : 1

  project                 = var.project_id
  region                  = var.region
  name                    = var.name
  tier                    = var.redis_tier
  memory_size_gb          = var.redis_memory_size_gb
  redis_version           = "REDIS_7_2"
  authorized_network      = var.network
  connect_mode            = "PRIVATE_SERVICE_ACCESS"
  auth_enabled            = true
  transit_encryption_mode = "SERVER_AUTHENTICATION"
  labels                  = local.labels

  # Memorystore's default is volatile-lru, and every key Drip writes has a TTL: under memory
  # pressure Redis would silently evict window state (limits exceeded), answers (duplicates) and
  # claim-checks (lost payloads). With noeviction writes fail instead: the limiter answers 503 and
  # Pub/Sub redelivers, nothing is lost. The memory alert (monitoring.tf) warns well before.
  redis_configs = {
    maxmemory-policy = "noeviction"
  }

  # Reservations are only useful while they are current; keep them through failovers, not
  # across disasters.
  persistence_config {
    persistence_mode    = "RDB"
    rdb_snapshot_period = "ONE_HOUR"
  }

  maintenance_policy {
    weekly_maintenance_window {
      day = "SUNDAY"
      start_time {
        hours   = 3
        minutes = 0
      }
    }
  }
}

# Memorystore for Redis Cluster connects through Private Service Connect, which it automates only
# where the network has a service connection policy for its service class in the region: without
# one, creating the cluster fails. One policy serves every cluster of the network and region.
resource "google_network_connectivity_service_connection_policy" "memorystore" {
  count = var.redis_cluster && var.create_service_connection_policy ? 1 : 0

  project       = var.project_id
  location      = var.region
  name          = "${var.name}-memorystore-redis"
  service_class = "gcp-memorystore-redis"
  description   = "Private Service Connect for Memorystore for Redis Cluster (Drip)"
  network       = var.network

  psc_config {
    subnetworks = [var.subnetwork]
  }
}

resource "google_redis_cluster" "drip" {
  count = var.redis_cluster ? 1 : 0

  project                 = var.project_id
  region                  = var.region
  name                    = var.name
  shard_count             = var.redis_cluster_shard_count
  authorization_mode      = "AUTH_MODE_IAM_AUTH"
  transit_encryption_mode = "TRANSIT_ENCRYPTION_MODE_SERVER_AUTHENTICATION"

  # As for the instance above: fail writes (503, redelivery) rather than evict state silently.
  redis_configs = {
    maxmemory-policy = "noeviction"
  }

  psc_configs {
    network = var.network
  }

  depends_on = [google_network_connectivity_service_connection_policy.memorystore]
}

locals {
  redis_url = var.redis_cluster ? (
    "rediss://${google_redis_cluster.drip[0].discovery_endpoints[0].address}:${google_redis_cluster.drip[0].discovery_endpoints[0].port}"
    ) : (
    "rediss://:${google_redis_instance.drip[0].auth_string}@${google_redis_instance.drip[0].host}:${google_redis_instance.drip[0].port}"
  )
  redis_ca = var.redis_cluster ? join("\n", flatten([
    for ca in google_redis_cluster.drip[0].managed_server_ca[0].ca_certs : ca.certificates
  ])) : google_redis_instance.drip[0].server_ca_certs[0].cert
}

# IAM authentication to the cluster: each service may connect to this one cluster only.
resource "google_project_iam_member" "services_connect_to_cluster" {
  for_each = var.redis_cluster ? local.service_members : {}

  project = var.project_id
  role    = "roles/redis.dbConnectionUser"
  member  = each.value

  condition {
    title       = "drip-cluster-only"
    description = "Connect to the Drip cluster and no other."
    expression  = "resource.name == \"projects/${var.project_id}/locations/${var.region}/clusters/${var.name}\""
  }
}

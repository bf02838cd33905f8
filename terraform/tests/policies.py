"""What the platform team's review asks of the module, as checks over the parsed HCL. Each policy
returns the violations it finds (an empty list when the module complies)."""

from __future__ import annotations

import re

from hcl import Module, unquote

PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")


def push_subscriptions_have_oidc_and_dead_letter_policy(module: Module):
    problems = []
    subscriptions = module.of_type("google_pubsub_subscription")
    pushes = {name: s for name, s in subscriptions.items() if s.has_block("push_config")}
    if not pushes:
        problems.append("no push subscription feeds the limiter")
    for name, subscription in pushes.items():
        if not subscription.has_block("push_config", "oidc_token"):
            problems.append(f"push subscription {name} sends no OIDC token")
        for oidc in (o for p in subscription.block("push_config") for o in p.block("oidc_token")):
            if not oidc.arg("service_account_email") or not oidc.arg("audience"):
                problems.append(f"push subscription {name}: oidc_token needs service_account_email and audience")
        if not subscription.has_block("dead_letter_policy"):
            problems.append(f"push subscription {name} has no dead_letter_policy")
        if not subscription.has_block("retry_policy"):
            problems.append(f"push subscription {name} has no retry_policy")
    return problems


def _topics_read(module: Module):
    """Topic resources some subscription reads (by `topic` or by iterating over them)."""
    read = set()
    for subscription in module.of_type("google_pubsub_subscription").values():
        source = str(subscription.arguments.get("for_each", "")) + str(subscription.arguments.get("topic", ""))
        read.update(re.findall(r"google_pubsub_topic\.(\w+)", source))
    return read


def every_dead_letter_topic_has_a_subscription(module: Module):
    topics = module.of_type("google_pubsub_topic")
    read = _topics_read(module)
    problems = [f"dead-letter topic {name} has no subscription: what is published to it is lost" for name in topics if "dlq" in name and name not in read]
    for name, subscription in module.of_type("google_pubsub_subscription").items():
        for policy in subscription.block("dead_letter_policy"):
            target = re.search(r"google_pubsub_topic\.(\w+)", str(policy.arguments.get("dead_letter_topic", "")))
            if not target or target.group(1) not in read:
                problems.append(f"subscription {name} dead-letters to a topic no subscription of this module reads")
    return problems


def pubsub_agent_can_dead_letter(module: Module):
    """The service agent needs publisher on the DLQ topic and subscriber on each push subscription."""
    problems = []
    agent = "local.pubsub_service_agent"
    topic_grants = [g for g in module.of_type("google_pubsub_topic_iam_member").values() if agent in str(g.arguments.get("member")) and g.arg("role") == "roles/pubsub.publisher"]
    if not topic_grants:
        problems.append("the Pub/Sub service agent cannot publish to the push dead-letter topic")
    subscription_grants = [g for g in module.of_type("google_pubsub_subscription_iam_member").values() if agent in str(g.arguments.get("member")) and g.arg("role") == "roles/pubsub.subscriber"]
    if not any("google_pubsub_subscription.push" in str(g.arguments.get("for_each")) for g in subscription_grants):
        problems.append("the Pub/Sub service agent is not subscriber on the push subscriptions")
    return problems


def no_public_access(module: Module):
    problems = []
    for resource_type, name, block in module.all_resources():
        members = [block.arguments.get("member")] + list(block.arguments.get("members") or [])
        for member in members:
            if any(public in str(member) for public in PUBLIC_MEMBERS):
                problems.append(f"{resource_type}.{name} grants {member}")
    return problems


# Roles that exist at project level only: writing metrics names no resource to narrow to.
PROJECT_ONLY_ROLES = {"roles/monitoring.metricWriter"}


def no_project_wide_grants(module: Module):
    """Project-level bindings only with a condition that narrows them to one resource, or of a
    role that exists at project level only (PROJECT_ONLY_ROLES)."""
    problems = []
    for resource_type, name, block in module.all_resources():
        if not resource_type.startswith("google_project_iam") or block.arg("role") in PROJECT_ONLY_ROLES:
            continue
        conditions = block.block("condition")
        if not conditions or "resource.name" not in str(conditions[0].arguments.get("expression")):
            problems.append(f"{resource_type}.{name}: project-wide {block.arg('role')}")
    return problems


def _service_roles(module: Module):
    """The services the module runs (local.services), each with its settings."""
    services = module.locals.get("services") or {}
    return {unquote(role): {unquote(k): v for k, v in settings.items()} for role, settings in services.items()}


INTERNAL_INGRESS = ("INGRESS_TRAFFIC_INTERNAL_ONLY", "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER")


def _routes(env) -> set[str]:
    """The route classes a service's environment serves (DRIP_ROUTES; every class when unset)."""
    match = re.search(r"DRIP_ROUTES\W+([a-z,]+)", str(env))
    return set(match.group(1).split(",")) if match else {"push", "admin", "feedback", "console"}


def _env_of(module: Module, settings: dict) -> str:
    """A service's environment: the local it names, as text."""
    name = str(settings.get("env", "")).removeprefix("${").removesuffix("}").removeprefix("local.")
    return str(module.locals.get(name, ""))


def cloud_run_is_private(module: Module):
    """The limiter and the dispatcher take internal traffic only; the services the internet may
    reach are the admin service (operators on laptops), which serves no /push, and the console
    service, which serves the console alone, behind IAP."""
    problems = []
    services = module.of_type("google_cloud_run_v2_service")
    if not services:
        problems.append("no Cloud Run service")
    roles = _service_roles(module)
    if set(roles) != {"limiter", "dispatcher", "admin", "console"}:
        problems.append(f"expected the limiter, dispatcher, admin and console services, found {sorted(roles)}")
    for role, settings in roles.items():
        ingress = unquote(str(settings.get("ingress")))
        if ingress in INTERNAL_INGRESS:
            continue
        if role == "console":
            if _routes(_env_of(module, settings)) != {"console"} or str(settings.get("iap")).lower() != "true":
                problems.append("the console service is reachable from the internet without IAP, or serves more than the console")
        elif role != "admin":
            problems.append(f"the {role} accepts traffic from the internet (ingress {ingress})")
        elif "push" in _routes(_env_of(module, settings)):
            problems.append("the admin service is reachable from the internet and serves /push")
    for name, service in services.items():
        if service.arg("ingress") not in INTERNAL_INGRESS and "each.value.ingress" not in str(service.arg("ingress")):
            problems.append(f"Cloud Run service {name} accepts traffic from the internet (ingress {service.arg('ingress')})")
        if service.arguments.get("invoker_iam_disabled") not in (None, False):
            problems.append(f"Cloud Run service {name} disables the invoker check")
        template = service.block("template")
        if not template or not template[0].arg("service_account"):
            problems.append(f"Cloud Run service {name} runs as the default compute service account")
        if not service.has_block("template", "vpc_access"):
            problems.append(f"Cloud Run service {name} has no VPC egress to reach Memorystore")
        probes = [p for c in (template[0].block("containers") if template else []) for p in c.block("startup_probe")]
        if not any(g.arg("path") == "/readyz" for p in probes for g in p.block("http_get")):
            problems.append(f"Cloud Run service {name} has no startup probe on /readyz")
    for name, grant in module.of_type("google_cloud_run_v2_service_iam_member").items():
        member = str(grant.arg("member"))
        # The one exception: the service accounts named in var.limits_api_callers, on the admin service.
        limits_caller = (
            "var.limits_api_callers" in str(grant.arguments.get("for_each"))
            and member.startswith("serviceAccount:")
            and '["admin"]' in str(grant.arguments.get("name"))
        )
        # And IAP's service agent, on the console service: IAP invokes it for the people it let in.
        iap_agent = member.endswith("@gcp-sa-iap.iam.gserviceaccount.com") and '["console"]' in str(grant.arguments.get("name"))
        if grant.arg("role") != "roles/run.invoker" or not ("google_service_account." in member or limits_caller or iap_agent):
            problems.append(f"invoker grant {name} is not run.invoker for one of the module's service accounts")
    return problems


def ingress_container_declares_a_port(module: Module):
    """Cloud Run refuses a multi-container revision unless exactly one container (the ingress
    container) declares a port: the first apply would create everything else and fail there."""
    problems = []
    for name, service in module.of_type("google_cloud_run_v2_service").items():
        for template in service.block("template"):
            containers = template.block("containers")
            with_ports = [c.arg("name") for c in containers if c.has_block("ports")]
            if len(with_ports) != 1:
                problems.append(f"{name}: {len(with_ports)} of its {len(containers)} containers declare a port (exactly one must)")
            elif with_ports[0] != "drip":
                problems.append(f"{name}: the port is declared on {with_ports[0]}, not on the drip container")
            for container in containers:
                for ports in container.block("ports"):
                    if str(ports.arguments.get("container_port")) != "8080":
                        problems.append(f"{name}: the drip container's port is not 8080, where it listens (PORT)")
    return problems


def admin_service_holds_no_signing_key(module: Module):
    """The admin service, reachable from the internet, creates no task: it is given neither the
    task signing key nor the right to read its secret, nor the queues."""
    problems = []
    text = (module.directory / "run.tf").read_text()
    if not re.search(r'for_each\s*=\s*contains\(\["admin",\s*"console"\],\s*each\.key\)\s*\?\s*{}\s*:\s*local\.signing_key_env', text):
        problems.append("the admin service (or the console service) is given the task signing key")
    grants = module.of_type("google_secret_manager_secret_iam_member").get("services_read_signing_key")
    if grants is None or 'role != "admin"' not in str(grants.arguments.get("for_each")):
        problems.append("the admin service's account may read the task signing key's secret")
    if "local.tasks_env" in str(module.locals.get("admin_env", "")):
        problems.append("the admin service is given the Cloud Tasks settings")
    return problems


def operators_reach_admin_routes_only(module: Module):
    """Operators on a laptop reach the admin service as the operator account (Token Creator on it
    for var.operators, invoker on the admin service), which serves admin and feedback routes only;
    the limiter, whose ingress is internal, serves no admin route."""
    problems = []
    roles = _service_roles(module)
    admin = roles.get("admin")
    if not admin:
        return ["no admin service: operators cannot reach production from a laptop"]
    admin_routes = _routes(_env_of(module, admin))
    if "push" in admin_routes or "admin" not in admin_routes:
        problems.append(f"the admin service serves {sorted(admin_routes)}: it must serve admin (and feedback), never push")
    if "admin" in _routes(_env_of(module, roles.get("limiter", {}))):
        problems.append("the limiter serves the admin routes: operators belong on the admin service")
    if "google_service_account.operator.email" not in str(module.locals.get("admin_env", "")):
        problems.append("the operator account is not on the admin service's DRIP_ADMIN_CALLERS")
    invokers = module.of_type("google_cloud_run_v2_service_iam_member").values()
    if not any('["admin"]' in str(g.arguments.get("name")) and "google_service_account.operator" in str(g.arguments.get("member")) for g in invokers):
        problems.append("the operator account may not invoke the admin service")
    minters = [g for g in module.of_type("google_service_account_iam_member").values() if g.arg("role") == "roles/iam.serviceAccountTokenCreator"]
    if not any("google_service_account.operator" in str(g.arguments.get("service_account_id")) and "var.operators" in str(g.arguments.get("for_each")) for g in minters):
        problems.append("var.operators may not act as the operator account (Token Creator on it)")
    return problems


def redis_cluster_has_a_connection_policy(module: Module):
    """Memorystore for Redis Cluster is created only where the network has a Private Service
    Connect service connection policy for gcp-memorystore-redis: the module makes one (or is told
    one exists) and creates the cluster after it."""
    problems = []
    policies = module.of_type("google_network_connectivity_service_connection_policy")
    if not any(p.arg("service_class") == "gcp-memorystore-redis" and p.has_block("psc_config") for p in policies.values()):
        problems.append("no service connection policy for gcp-memorystore-redis: creating the cluster fails")
    for name, cluster in module.of_type("google_redis_cluster").items():
        if "google_network_connectivity_service_connection_policy" not in str(cluster.arguments.get("depends_on")):
            problems.append(f"google_redis_cluster.{name} may be created before its service connection policy")
    return problems


def redis_has_auth_and_tls(module: Module):
    problems = []
    for name, instance in module.of_type("google_redis_instance").items():
        if instance.arguments.get("auth_enabled") is not True:
            problems.append(f"Memorystore instance {name} has AUTH off")
        if instance.arg("transit_encryption_mode") != "SERVER_AUTHENTICATION":
            problems.append(f"Memorystore instance {name} has in-transit encryption off")
    for name, cluster in module.of_type("google_redis_cluster").items():
        if cluster.arg("authorization_mode") != "AUTH_MODE_IAM_AUTH":
            problems.append(f"Memorystore cluster {name} has authorization off")
        if cluster.arg("transit_encryption_mode") != "TRANSIT_ENCRYPTION_MODE_SERVER_AUTHENTICATION":
            problems.append(f"Memorystore cluster {name} has in-transit encryption off")
    if not module.of_type("google_redis_instance") and not module.of_type("google_redis_cluster"):
        problems.append("no Memorystore")
    return problems


def redis_secrets_stay_in_secret_manager(module: Module):
    problems = []
    for name, service in module.of_type("google_cloud_run_v2_service").items():
        for template in service.block("template"):
            for container in template.block("containers"):
                for env in container.block("env"):
                    if env.arg("name") == "REDIS_URL" and not env.has_block("value_source", "secret_key_ref"):
                        problems.append(f"{name}: REDIS_URL is plain environment, not a secret reference")
    for key in ("common_env", "limiter_env", "dispatcher_env"):
        text = str(module.locals.get(key, ""))
        if "auth_string" in text or "redis_url" in text:
            problems.append(f"local.{key} passes the Redis AUTH string as plain environment")
        if "task_signing_key" in text or "DRIP_TASK_SIGNING_KEY" in text:
            problems.append(f"local.{key} passes the task signing key as plain environment")
    for output in (module.directory / "outputs.tf").read_text().split("output ")[1:]:
        if "auth_string" in output or "local.redis_url" in output:
            problems.append("an output exposes the Redis AUTH string")
    return problems


def redis_never_evicts(module: Module):
    """Every key Drip writes has a TTL, so Memorystore's default volatile-lru would evict limits,
    answers and payloads silently; noeviction makes a full Redis fail writes (503, redelivery)."""
    problems = []
    for resource_type in ("google_redis_instance", "google_redis_cluster"):
        for name, redis in module.of_type(resource_type).items():
            configs = redis.arguments.get("redis_configs") or {}
            policy = next((v for k, v in dict(configs).items() if unquote(str(k)) == "maxmemory-policy"), None)
            if policy is None or unquote(str(policy)) != "noeviction":
                problems.append(f"{resource_type}.{name} does not set maxmemory-policy = noeviction")
    policies = module.of_type("google_monitoring_alert_policy")
    filters = [str(c_t.arguments.get("filter")) for p in policies.values() for c in p.block("conditions") for c_t in c.block("condition_threshold")]
    if not any("memory/usage_ratio" in f for f in filters) or not any("cluster/memory/maximum_utilization" in f for f in filters):
        problems.append("no alert on Redis memory (instance usage_ratio and cluster maximum_utilization)")
    return problems


def dispatcher_knows_the_last_attempt(module: Module):
    """The dispatcher dead-letters on the queue's last attempt only if it knows max_attempts."""
    problems = []
    dispatcher_env = str(module.locals.get("dispatcher_env", ""))
    if "DRIP_TASKS_MAX_ATTEMPTS" not in dispatcher_env or "var.tasks_max_attempts" not in dispatcher_env:
        problems.append("the dispatcher is not told the queues' max_attempts (DRIP_TASKS_MAX_ATTEMPTS)")
    for name, queue in module.of_type("google_cloud_tasks_queue").items():
        for retry in queue.block("retry_config"):
            if "var.tasks_max_attempts" not in str(retry.arguments.get("max_attempts")):
                problems.append(f"queue {name}: max_attempts is not var.tasks_max_attempts")
    return problems


def tasks_are_signed_with_a_secret(module: Module):
    """Both services get DRIP_TASK_SIGNING_KEY (and the previous key during a rotation) from the
    secret made outside Terraform (var.task_signing_key_secret), so the key's value never passes
    through Terraform: no variable holds it and no secret version of the module stores it."""
    text = "".join(path.read_text() for path in sorted(module.directory.glob("*.tf")))
    problems = []
    signing_env = str(module.locals.get("signing_key_env", ""))
    if "DRIP_TASK_SIGNING_KEY" not in signing_env or "DRIP_TASK_SIGNING_KEY_PREVIOUS" not in signing_env:
        problems.append("local.signing_key_env does not name DRIP_TASK_SIGNING_KEY and its previous key")
    if not re.search(r'for_each\s*=\s*[^\n]*local\.signing_key_env\s*content\s*{[^}]*value_source\s*{\s*secret_key_ref\s*{\s*secret\s*=\s*var\.task_signing_key_secret', text):
        problems.append("the services get no DRIP_TASK_SIGNING_KEY from var.task_signing_key_secret")
    if re.search(r'variable\s+"task_signing_key"\s*{', text) or "task_signing_key" in str(module.locals.get("secret_names", "")):
        problems.append("the task signing key's value passes through Terraform (a variable or a module secret)")
    if "task_signing_key_secret" not in str(module.of_type("google_secret_manager_secret_iam_member")):
        problems.append("the services may not read var.task_signing_key_secret")
    # A revision that starts before its account may read the secret fails to deploy.
    for name, service in module.of_type("google_cloud_run_v2_service").items():
        if "services_read_signing_key" not in str(service.arguments.get("depends_on")):
            problems.append(f"{name} does not wait for the grant to read the signing key's secret")
    return problems


def each_route_class_has_its_own_callers(module: Module):
    """The limiter's push, admin and feedback routes and the dispatcher's tasks each name their own
    callers, with authentication on: no one allow-list covers every route."""
    limiter_env = str(module.locals.get("limiter_env", ""))
    dispatcher_env = str(module.locals.get("dispatcher_env", ""))
    problems = []
    if "DRIP_OIDC_ALLOWED_EMAILS" in limiter_env + dispatcher_env:
        problems.append("DRIP_OIDC_ALLOWED_EMAILS (one list for every route) is set")
    admin_env = str(module.locals.get("admin_env", ""))
    if "DRIP_OIDC_ALLOWED_EMAILS" in admin_env:
        problems.append("DRIP_OIDC_ALLOWED_EMAILS (one list for every route) is set on the admin service")
    for name in ("DRIP_PUSH_CALLERS", "DRIP_FEEDBACK_CALLERS"):
        if name not in limiter_env:
            problems.append(f"the limiter is not given {name}")
    for name in ("DRIP_ADMIN_CALLERS", "DRIP_FEEDBACK_CALLERS"):
        if name not in admin_env:
            problems.append(f"the admin service is not given {name}")
    if not re.search(r"DRIP_PUSH_CALLERS\W+google_service_account\.push\.email", limiter_env):
        problems.append("DRIP_PUSH_CALLERS is not the push subscriptions' account")
    if "DRIP_TASK_CALLERS" not in dispatcher_env or "google_service_account.tasks.email" not in dispatcher_env:
        problems.append("the dispatcher's DRIP_TASK_CALLERS is not the tasks account")
    for env in (limiter_env, dispatcher_env, admin_env):
        if not re.search(r"DRIP_AUTH\W+oidc", env):
            problems.append("a service runs without DRIP_AUTH = oidc")
    return problems


def metrics_reach_cloud_monitoring(module: Module):
    """Each service runs the Managed Service for Prometheus collector beside it, configured to
    scrape the services' own metrics listener (DRIP_METRICS_PORT), and its account may write
    metrics."""
    problems = []
    port = str(module.locals.get("metrics_port", ""))
    if "DRIP_METRICS_PORT" not in str(module.locals.get("common_env", "")):
        problems.append("the services are not given DRIP_METRICS_PORT")
    if "local.metrics_port" not in str(module.locals.get("run_monitoring", "")) or not port:
        problems.append("the collector's RunMonitoring config does not scrape local.metrics_port")
    for name, service in module.of_type("google_cloud_run_v2_service").items():
        template = service.block("template")
        containers = template[0].block("containers") if template else []
        collectors = [c for c in containers if "cloud-run-gmp-sidecar" in str(c.arguments.get("image")) or "prometheus_sidecar_image" in str(c.arguments.get("image"))]
        if not collectors:
            problems.append(f"{name} has no Managed Service for Prometheus collector")
        elif not any(m.arg("mount_path") == "/etc/rungmp" for c in collectors for m in c.block("volume_mounts")):
            problems.append(f"{name}'s collector does not read its RunMonitoring config")
    writers = [g for g in module.of_type("google_project_iam_member").values() if g.arg("role") == "roles/monitoring.metricWriter"]
    grantees = " ".join(str(g.arguments.get("for_each")) + str(g.arguments.get("member")) for g in writers)
    grantees = grantees.replace("local.service_members", str(module.locals.get("service_members", "")))
    for account in ("google_service_account.limiter", "google_service_account.dispatcher", "google_service_account.admin"):
        if account not in grantees:
            problems.append(f"{account} may not write metrics")
    return problems


def rules_reload_without_redeploy(module: Module):
    """The rules reach both services from Secret Manager's latest version, re-read while they run."""
    text = "".join(path.read_text() for path in sorted(module.directory.glob("*.tf")))
    problems = []
    if not re.search(r'name\s*=\s*"rules"\s*secret\s*{[^}]*?items\s*{[^}]*version\s*=\s*"latest"', text):
        problems.append("the rules volume is pinned to one secret version: a rules change needs a new revision")
    if "DRIP_RULES_POLL_MS" not in str(module.locals.get("common_env", "")):
        problems.append("the services are not told to re-read the rules (DRIP_RULES_POLL_MS)")
    return problems


def dedicated_service_accounts(module: Module):
    problems = []
    accounts = module.of_type("google_service_account")
    for role in ("limiter", "dispatcher", "admin", "operator", "push", "tasks"):
        if role not in accounts:
            problems.append(f"no dedicated service account for the {role}")
    roles = _service_roles(module)
    # The console service runs as the admin service's account: both serve operators, with the
    # same grants (Redis, the rules), and neither holds the task signing key.
    if "console" in roles and str(roles["console"].get("account")) != str(roles.get("admin", {}).get("account")):
        problems.append("the console service runs as another account than the admin service's")
    used = [str(settings.get("account")) for role, settings in roles.items() if role != "console"]
    if len(set(used)) != len(used):
        problems.append("the limiter and the dispatcher share a service account")
    for account in used:
        if "compute@developer" in account or "google_service_account." not in account:
            problems.append(f"a service runs as {account}, not a dedicated service account")
    return problems


def queues_survive_destroy(module: Module):
    problems = []
    queues = module.of_type("google_cloud_tasks_queue")
    if not queues:
        problems.append("no Cloud Tasks queue")
    for name, queue in queues.items():
        lifecycle = queue.block("lifecycle")
        if not lifecycle or lifecycle[0].arguments.get("prevent_destroy") is not True:
            problems.append(f"queue {name} lacks prevent_destroy (a deleted queue name is blocked for 7 days)")
        if not queue.has_block("rate_limits") or not queue.has_block("retry_config"):
            problems.append(f"queue {name} needs explicit rate_limits and retry_config")
    return problems


def limiter_enqueues_with_least_privilege(module: Module):
    problems = []
    enqueuers = [g for g in module.of_type("google_cloud_tasks_queue_iam_member").values() if g.arg("role") == "roles/cloudtasks.enqueuer"]
    if not any("google_service_account.limiter" in str(g.arguments.get("member")) for g in enqueuers):
        problems.append("the limiter cannot enqueue tasks on its queues")
    act_as = [g for g in module.of_type("google_service_account_iam_member").values() if g.arg("role") == "roles/iam.serviceAccountUser"]
    if not any("google_service_account.tasks" in str(g.arguments.get("service_account_id")) and "limiter" in str(g.arguments.get("member")) for g in act_as):
        problems.append("the limiter cannot act as the tasks service account")
    # The dispatcher reschedules events an `overflow: { url }` target told to wait.
    if not any("google_service_account.dispatcher" in str(g.arguments.get("member")) for g in enqueuers):
        problems.append("the dispatcher cannot enqueue tasks (overflow: { url } reschedules)")
    if not any("google_service_account.tasks" in str(g.arguments.get("service_account_id")) and "dispatcher" in str(g.arguments.get("member")) for g in act_as):
        problems.append("the dispatcher cannot act as the tasks service account")
    token_creators = [g for g in module.of_type("google_service_account_iam_member").values() if g.arg("role") == "roles/iam.serviceAccountTokenCreator"]
    for grant in token_creators:
        account = str(grant.arguments.get("service_account_id"))
        if "google_service_account.push" not in account and "google_service_account.operator" not in account:
            problems.append("Token Creator granted beyond the push and operator service accounts")
    return problems


def alerts_exist(module: Module):
    problems = []
    metrics = module.of_type("google_logging_metric")
    if not any("max_delay_exceeded" in str(m.arguments.get("filter")) for m in metrics.values()):
        problems.append("no log-based metric for max_delay_exceeded")
    if not any("new rules refused" in str(m.arguments.get("filter")) for m in metrics.values()):
        problems.append("no log-based metric for a refused rules file")
    policies = module.of_type("google_monitoring_alert_policy")
    if not any("num_undelivered_messages" in str(c_t.arguments.get("filter")) for p in policies.values() for c in p.block("conditions") for c_t in c.block("condition_threshold")):
        problems.append("no alert on the DLQ backlog")
    if not all("var.notification_channels" in str(p.arguments.get("notification_channels")) for p in policies.values()):
        problems.append("an alert policy ignores var.notification_channels")
    problems += _lag_alerts(policies)
    return problems


def _lag_alerts(policies) -> list[str]:
    """Alerts coupled to lag: the push subscriptions' oldest unacked message, the limiter's 5xx
    share, dispatch lateness beyond the rules' delivery_margin, delays nearing max_delay (the
    PromQL names what the services export: drip_delivery_margin_seconds, drip_max_delay_seconds)."""
    thresholds = [c_t for p in policies.values() for c in p.block("conditions") for c_t in c.block("condition_threshold")]
    queries = [str(q.arguments.get("query")) for p in policies.values() for c in p.block("conditions") for q in c.block("condition_prometheus_query_language")]
    problems = []
    if not any("oldest_unacked_message_age" in str(t.arguments.get("filter")) and "google_pubsub_subscription.push" in str(t.arguments.get("filter")) for t in thresholds):
        problems.append("no alert on the push subscriptions' oldest unacked message")
    if not any("response_code_class" in str(t.arguments.get("filter")) and t.arguments.get("denominator_filter") for t in thresholds):
        problems.append("no alert on the limiter's share of 5xx answers")
    if not any("drip_dispatch_lateness_seconds" in q and "drip_delivery_margin_seconds" in q for q in queries):
        problems.append("no alert on dispatch lateness beyond the delivery margin")
    if not any("drip_delay_seconds_bucket" in q and "drip_max_delay_seconds" in q for q in queries):
        problems.append("no alert on delays nearing max_delay")
    if not any("drip_delay_seconds_max" in q and "drip_max_delay_seconds" in q for q in queries):
        problems.append("no alert on the one key whose delay nears max_delay (a p99 hides it)")
    return problems


def variables_are_typed_and_described(module: Module):
    problems = []
    for name, variable in module.variables.items():
        if "type" not in variable.arguments:
            problems.append(f"variable {name} has no type")
        if not variable.arg("description"):
            problems.append(f"variable {name} has no description")
    return problems


POLICIES = {
    f.__name__: f
    for f in [
        push_subscriptions_have_oidc_and_dead_letter_policy,
        every_dead_letter_topic_has_a_subscription,
        pubsub_agent_can_dead_letter,
        no_public_access,
        no_project_wide_grants,
        cloud_run_is_private,
        ingress_container_declares_a_port,
        operators_reach_admin_routes_only,
        admin_service_holds_no_signing_key,
        redis_cluster_has_a_connection_policy,
        redis_has_auth_and_tls,
        redis_secrets_stay_in_secret_manager,
        redis_never_evicts,
        dispatcher_knows_the_last_attempt,
        tasks_are_signed_with_a_secret,
        each_route_class_has_its_own_callers,
        metrics_reach_cloud_monitoring,
        rules_reload_without_redeploy,
        dedicated_service_accounts,
        queues_survive_destroy,
        limiter_enqueues_with_least_privilege,
        alerts_exist,
        variables_are_typed_and_described,
    ]
}

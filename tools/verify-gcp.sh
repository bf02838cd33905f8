#!/usr/bin/env bash
# ./run verify-gcp: deploys Drip into a sandbox project, checks what only a real project can show,
# prints a report, and destroys everything it made: on success, on failure and on Ctrl-C alike.
#
#   ./run verify-gcp --project SANDBOX [--region REGION] [--yes] [--keep] [--dry-run]
#   ./run verify-gcp --project SANDBOX --sweep [--yes] [--dry-run]
#
# Everything it makes carries the label drip-verify-run=<run id> (queues and the image, which take
# no labels, are named after the run), so --sweep finds what a crashed run left. --dry-run prints
# every command it would run against the project, and runs none of them. --keep leaves the
# deployment up for a look (then --sweep removes it). It needs gcloud (logged in, with the roles of
# docs/operations.md "Deploying"), terraform, curl, python3 and cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT="" REGION="europe-west1" YES=false KEEP=false DRY=false SWEEP=false
while [ $# -gt 0 ]; do
  case "$1" in
    --project) PROJECT=$2; shift 2 ;;
    --region) REGION=$2; shift 2 ;;
    --yes) YES=true; shift ;;
    --keep) KEEP=true; shift ;;
    --dry-run) DRY=true; shift ;;
    --sweep) SWEEP=true; shift ;;
    *) echo "usage: ./run verify-gcp --project SANDBOX [--region REGION] [--yes] [--keep] [--dry-run] [--sweep]" >&2; exit 2 ;;
  esac
done
[ -n "$PROJECT" ] || { echo "verify-gcp: name the sandbox project: --project SANDBOX (everything is made there, then destroyed)" >&2; exit 2; }

RUN_ID=$(date -u +%m%d%H%M%S)
NAME="dv${RUN_ID}"                       # the module's prefix: services, queues, accounts, secrets
LABEL="drip-verify-run"
IMAGE="${REGION}-docker.pkg.dev/${PROJECT}/drip/drip:${NAME}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/drip-verify.XXXXXX")
EXAMPLE="$WORK/example"
DRIP="$PWD/target/release/drip"
REPORT="$WORK/report.txt"
FAILED=0
STAGE="start"

# A dry run prints each command on the original stdout (fd 3), even from inside $(...) or >/dev/null.
exec 3>&1

say() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }

# Every command that touches the project goes through here: a dry run prints it instead.
cloud() {
  if $DRY; then printf '+ %s\n' "$*" >&3; return 0; fi
  "$@"
}

# A command whose output is read: a dry run prints it and answers the stand-in value given first.
cloud_out() {
  local stand_in=$1; shift
  if $DRY; then printf '+ %s\n' "$*" >&3; printf '%s\n' "$stand_in"; return 0; fi
  "$@"
}

# Whether a resource exists (COMMAND describes it): a dry run says no, so it prints the creation too.
exists() {
  if $DRY; then printf '+ %s\n' "$*" >&3; return 1; fi
  "$@" >/dev/null 2>&1
}

# check ID WHAT FUNCTION: runs one check and records its verdict in the report.
check() {
  local id=$1 what=$2; shift 2
  say "check $id: $what"
  if $DRY; then
    "$@"
    printf 'DRY   %-22s %s\n' "$id" "$what" >>"$REPORT"
  elif "$@"; then
    printf 'PASS  %-22s %s\n' "$id" "$what" >>"$REPORT"
  else
    printf 'FAIL  %-22s %s\n' "$id" "$what" >>"$REPORT"
    FAILED=1
  fi
}

estimate() {
  cat <<EOF
verify-gcp deploys Drip into project $PROJECT ($REGION) as "$NAME", checks it, and destroys it.
Estimated cost of one run (about 45 minutes; list prices as in docs/capacity.md, before any free tier):
  Memorystore for Redis, Standard HA 1 GB (\$0.064 per GB-hour) ............ ~\$0.05
  Cloud Run: limiter and dispatcher minimum instances with their sidecars,
    4 vCPU and 2 GiB for ~45 min (\$0.000018 per vCPU-s, \$0.000002 per GiB-s) ~\$0.20
  Cloud Build: one image build, e2-highcpu-8, ~15 min (\$0.016 per minute) .. ~\$0.25
  Pub/Sub, Cloud Tasks, Secret Manager, Artifact Registry, Monitoring ........ < \$0.05
  total ......................................................................... ~\$0.55
EOF
}

confirm() {
  $YES && return 0
  if $DRY; then say "dry run: not asking (a real run asks here unless --yes)"; return 0; fi
  local answer
  read -r -p "Go on? [y/N] " answer
  [ "$answer" = y ] || [ "$answer" = yes ] || { say "nothing done"; exit 1; }
}

# What a crashed run left: every resource carrying the label, and the queues and images named dv*.
sweep() {
  local selector="labels.${LABEL}:*" kind name
  say "sweeping what runs of verify-gcp left in $PROJECT"
  local where=()
  for kind in "run services" "pubsub subscriptions" "pubsub topics" "secrets"; do
    where=(--project "$PROJECT")
    [ "$kind" = "run services" ] && where+=(--region "$REGION")
    # shellcheck disable=SC2086 # the kind is two words on purpose
    for name in $(cloud_out "" gcloud $kind list "${where[@]}" --filter="$selector" --format='value(name)'); do
      # shellcheck disable=SC2086
      cloud gcloud $kind delete "$name" "${where[@]}" --quiet
    done
  done
  for name in $(cloud_out "" gcloud redis instances list --project "$PROJECT" --region "$REGION" --filter="$selector" --format='value(name)'); do
    cloud gcloud redis instances delete "$name" --project "$PROJECT" --region "$REGION" --quiet
  done
  for name in $(cloud_out "" gcloud tasks queues list --project "$PROJECT" --location "$REGION" --filter='name~/queues/dv[0-9]+-' --format='value(name)'); do
    cloud gcloud tasks queues delete "$name" --project "$PROJECT" --location "$REGION" --quiet
  done
  for name in $(cloud_out "" gcloud iam service-accounts list --project "$PROJECT" --filter='email~^dv[0-9]+-' --format='value(email)'); do
    cloud gcloud iam service-accounts delete "$name" --project "$PROJECT" --quiet
  done
  for name in $(cloud_out "" gcloud artifacts docker images list "${REGION}-docker.pkg.dev/${PROJECT}/drip/drip" --include-tags --filter='tags~^dv[0-9]+' --format='value[separator=":"](package,tags)'); do
    cloud gcloud artifacts docker images delete "$name" --delete-tags --quiet
  done
}

prerequisites() {
  STAGE="prerequisites"
  say "the APIs, private services access, the Pub/Sub service agent, the repository and the signing key"
  cloud gcloud services enable pubsub.googleapis.com cloudtasks.googleapis.com redis.googleapis.com run.googleapis.com \
    secretmanager.googleapis.com artifactregistry.googleapis.com cloudbuild.googleapis.com servicenetworking.googleapis.com \
    compute.googleapis.com iam.googleapis.com iamcredentials.googleapis.com monitoring.googleapis.com logging.googleapis.com \
    cloudresourcemanager.googleapis.com iap.googleapis.com --project "$PROJECT"
  if ! exists gcloud compute addresses describe google-managed-services-default --global --project "$PROJECT"; then
    cloud gcloud compute addresses create google-managed-services-default --global --purpose=VPC_PEERING \
      --prefix-length=16 --network=default --project "$PROJECT"
  fi
  cloud gcloud services vpc-peerings connect --service=servicenetworking.googleapis.com \
    --ranges=google-managed-services-default --network=default --project "$PROJECT" || true
  cloud gcloud beta services identity create --service=pubsub.googleapis.com --project "$PROJECT"
  if ! exists gcloud artifacts repositories describe drip --location "$REGION" --project "$PROJECT"; then
    cloud gcloud artifacts repositories create drip --repository-format=docker --location "$REGION" --project "$PROJECT"
  fi
  cloud gcloud secrets create "$NAME-task-signing-key" --labels="$LABEL=$NAME" --project "$PROJECT"
  (umask 077 && openssl rand -hex 32 >"$WORK/signing-key")
  cloud gcloud secrets versions add "$NAME-task-signing-key" --data-file="$WORK/signing-key" --project "$PROJECT"
  rm -f "$WORK/signing-key"
}

deploy() {
  STAGE="build"
  say "building the image with Cloud Build (the Dockerfile), and the drip CLI here"
  cloud gcloud builds submit --tag "$IMAGE" --project "$PROJECT" --region "$REGION" .
  if $DRY; then printf '+ %s\n' "cargo build --release --locked -p drip-cli" >&3; else cargo build --release --locked -p drip-cli; fi
  STAGE="apply"
  say "a copy of terraform/examples/basic in $EXAMPLE: local state, this run's name and label"
  mkdir -p "$EXAMPLE"
  cp terraform/examples/basic/main.tf terraform/examples/basic/rules.yaml terraform/examples/basic/rules-topics.json "$EXAMPLE/"
  sed -i "s|source = \"../..\"|source = \"$PWD/terraform\"|" "$EXAMPLE/main.tf"
  printf 'terraform {\n  backend "local" {}\n}\n' >"$EXAMPLE/backend_override.tf"
  local account; account=$(cloud_out "verifier@example.com" gcloud config get-value account)
  cat >"$EXAMPLE/terraform.tfvars" <<EOF
project_id              = "$PROJECT"
region                  = "$REGION"
name                    = "$NAME"
labels                  = { "$LABEL" = "$NAME" }
operators               = ["user:$account"]
console_operators       = ["$account"]
task_signing_key_secret = "$NAME-task-signing-key"
EOF
  cloud terraform -chdir="$EXAMPLE" init -input=false
  cloud terraform -chdir="$EXAMPLE" apply -input=false -auto-approve -var "image_tag=$NAME"
}

output() { cloud_out "$2" terraform -chdir="$EXAMPLE" output -raw "$1"; }

operator_token() { # operator_token AUDIENCE
  cloud_out "TOKEN" gcloud auth print-identity-token --impersonate-service-account="$OPERATOR" --audiences="$1" --include-email
}

services_ready() {
  local service status
  for service in limiter dispatcher admin console; do
    status=$(cloud_out "True" gcloud run services describe "$NAME-$service" --region "$REGION" --project "$PROJECT" \
      --format='value(status.conditions[0].status)')
    [ "$status" = True ] || { say "$NAME-$service is not ready: $status"; return 1; }
  done
}

sidecar_revision() {
  local containers
  containers=$(cloud_out "2" gcloud run services describe "$NAME-limiter" --region "$REGION" --project "$PROJECT" \
    --format='value(spec.template.spec.containers.len())')
  [ "$containers" = 2 ]
}

replan_no_change() {
  cloud terraform -chdir="$EXAMPLE" plan -input=false -detailed-exitcode -var "image_tag=$NAME" >/dev/null
}

anonymous_refused() {
  local code
  code=$(cloud_out "404" curl -s -o /dev/null -w '%{http_code}' -X POST "$LIMITER_URL/push")
  case "$code" in 401|403|404) ;; *) say "an anonymous push got $code"; return 1 ;; esac
  code=$(cloud_out "403" curl -s -o /dev/null -w '%{http_code}' "$ADMIN_URL/v1/limits")
  case "$code" in 401|403) ;; *) say "an anonymous admin call got $code"; return 1 ;; esac
}

# The console service is behind IAP: an anonymous browser is sent to Google's sign-in (IAP's
# answer, never the console's page).
console_behind_iap() {
  local code page
  page=$(cloud_out "" curl -s -D - -o /dev/null "$CONSOLE_URL")
  code=$(printf '%s\n' "$page" | sed -n 's/^HTTP[^ ]* \([0-9]*\).*/\1/p' | head -1)
  code=${code:-302}
  case "$code" in 302|401|403) ;; *) say "an anonymous browser got $code from the console"; return 1 ;; esac
  if printf '%s' "$page" | grep -qi '^location:' && ! printf '%s' "$page" | grep -qi '^location: https://accounts.google.com'; then
    say "the console redirected elsewhere than Google's sign-in"; return 1
  fi
}

# The console opens for an operator through IAP: programmatic access with the verifier's own
# Google ID token, as a browser's session would carry the same identity; the page names the
# caller as an operator.
console_opens() {
  local token page
  token=$(cloud_out "TOKEN" gcloud auth print-identity-token)
  page=$(cloud_out "operator" curl -sf -H "Authorization: Bearer $token" "$CONSOLE_URL")
  printf '%s' "$page" | grep -q "operator" || { say "the console did not open for the operator"; return 1; }
}

wrong_audience_refused() {
  local token code
  token=$(operator_token "https://wrong-audience.example")
  code=$(cloud_out "401" curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "$ADMIN_URL/v1/limits")
  case "$code" in 401|403) ;; *) say "a token for another audience got $code"; return 1 ;; esac
  code=$(cloud_out "404" curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $(operator_token "$ADMIN_URL")" "$ADMIN_URL/push")
  [ "$code" = 404 ] || { say "the admin service answered /push with $code"; return 1; }
}

# 60 payouts of one merchant in one publish; each arrives once, at most 10 a second (the rule's
# 10/1s), counted per second of drip-scheduled-for and of the topics' publish times.
drip_at_the_limit() {
  local access
  access=$(cloud_out "ACCESS" gcloud auth print-access-token)
  python3 -c 'import base64, json; print(json.dumps({"messages": [{"data": base64.b64encode(json.dumps({"merchant_id": "m1", "n": i}).encode()).decode(), "attributes": {"event_type": "payout"}} for i in range(60)]}))' >"$WORK/burst.json"
  cloud curl -sf -X POST -H "Authorization: Bearer $access" -H "Content-Type: application/json" \
    "https://pubsub.googleapis.com/v1/projects/$PROJECT/topics/payout-events:publish" -d "@$WORK/burst.json" >/dev/null
  : >"$WORK/arrived.jsonl"
  local deadline=$((SECONDS + 180)) subscription
  while [ "$SECONDS" -lt "$deadline" ]; do
    for subscription in payouts-ready payouts-overflow; do
      cloud_out "[]" gcloud pubsub subscriptions pull "$subscription" --project "$PROJECT" --limit 100 --auto-ack --format=json \
        | python3 -c 'import json, sys; [print(json.dumps(m["message"])) for m in json.load(sys.stdin)]' >>"$WORK/arrived.jsonl"
    done
    $DRY && break
    [ "$(python3 -c 'import json, sys; print(len({json.loads(l)["attributes"]["drip-message-id"] for l in open(sys.argv[1])}))' "$WORK/arrived.jsonl")" -ge 60 ] && break
    sleep 2
  done
  $DRY && return 0
  python3 - "$WORK/arrived.jsonl" <<'EOF'
import collections, json, sys
messages = [json.loads(line) for line in open(sys.argv[1])]
ids = {m["attributes"]["drip-message-id"] for m in messages}
per_slot = collections.Counter(m["attributes"]["drip-scheduled-for"][:19] for m in messages if "drip-scheduled-for" in m["attributes"])
per_publish = collections.Counter(m["publishTime"][:19] for m in messages)
print(f"arrived {len(ids)} of 60 ({len(messages)} deliveries); most per second: {max(per_slot.values(), default=0)} at the slots, {max(per_publish.values(), default=0)} at the topics", file=sys.stderr)
sys.exit(0 if len(ids) == 60 and max(per_slot.values(), default=0) <= 10 else 1)
EOF
}

partner_429_pauses() {
  local token; token=$(operator_token "$ADMIN_URL")
  cloud "$DRIP" feedback --api "$ADMIN_URL" --api-token "$token" --rule payouts --key tenant_m1:payouts --status 429 --retry-after 60
  cloud_out "paused     until" "$DRIP" inspect payouts tenant_m1:payouts --api "$ADMIN_URL" --api-token "$token" | grep -q "paused"
}

# An SMS of 50 parts is over its rule's 20 a minute: dead-lettered; replayed, it comes back, and
# the replay says so instead of replaying it again.
dead_letter_replayed() {
  cloud gcloud pubsub topics publish sms-events --project "$PROJECT" --attribute=event_type=sms \
    --message='{"user": {"id": "u1"}, "parts": 50}'
  local summary
  summary=$(cloud_out '{"replayed": 1, "deadLetteredAgain": 1}' "$DRIP" dlq replay --project "$PROJECT" --subscription sms-dlq \
    --topic sms-events --reason cost_exceeds_limit --idle 60s --output json)
  python3 -c 'import json, sys; s = json.loads(sys.argv[1]); sys.exit(0 if s["replayed"] == 1 and s["deadLetteredAgain"] == 1 else 1)' "$summary"
}

destroy() {
  local status=$?
  trap - EXIT INT TERM
  if [ -f "$REPORT" ]; then
    echo
    echo "verify-gcp report: project $PROJECT, region $REGION, run $NAME (stopped at: $STAGE)"
    cat "$REPORT"
  fi
  if $KEEP && ! $DRY; then
    say "--keep: $NAME stays up; ./run verify-gcp --project $PROJECT --sweep removes it"
    exit $((status || FAILED))
  fi
  say "destroying everything this run made"
  if [ -d "$EXAMPLE" ]; then
    # The queues refuse to be destroyed by Terraform (prevent_destroy): out of the state, then deleted.
    cloud terraform -chdir="$EXAMPLE" state rm 'module.drip.google_cloud_tasks_queue.drip' || true
    cloud terraform -chdir="$EXAMPLE" destroy -input=false -auto-approve -var "image_tag=$NAME" || status=1
  fi
  local queue
  for queue in "$NAME-0" "$NAME-1"; do
    cloud gcloud tasks queues delete "$queue" --location "$REGION" --project "$PROJECT" --quiet || true
  done
  cloud gcloud secrets delete "$NAME-task-signing-key" --project "$PROJECT" --quiet || true
  cloud gcloud artifacts docker images delete "$IMAGE" --delete-tags --quiet || true
  rm -rf "$WORK"
  [ "$FAILED" = 0 ] || status=1
  exit "$status"
}

estimate
if $SWEEP; then
  confirm
  sweep
  exit 0
fi
confirm
: >"$REPORT"
trap destroy EXIT
trap 'exit 130' INT TERM
prerequisites
deploy
STAGE="checks"
LIMITER_URL=$(output limiter_url "https://$NAME-limiter-000000000000.$REGION.run.app")
ADMIN_URL=$(output admin_url "https://$NAME-admin-000000000000.$REGION.run.app")
OPERATOR=$(output operator_service_account "$NAME-operator@$PROJECT.iam.gserviceaccount.com")
CONSOLE_URL=$(output console_url "https://$NAME-console-000000000000.$REGION.run.app/console")
check services-ready "the limiter, dispatcher, admin and console services are ready" services_ready
check sidecar-revision "the limiter's revision runs two containers (one declares the port)" sidecar_revision
check replan-no-change "a second plan has no change" replan_no_change
check anonymous-refused "anonymous calls are refused by Google's front end, never answered by Drip" anonymous_refused
check wrong-audience-refused "a token for another audience is refused; the admin service has no /push" wrong_audience_refused
check drip-at-the-limit "60 payouts arrive once each, at most 10 a second" drip_at_the_limit
check partner-429-pauses "a partner's 429 with Retry-After pauses the key" partner_429_pauses
check dead-letter-replayed "a dead letter is replayed once and reported when it comes back" dead_letter_replayed
check console-behind-iap "the console service sends an anonymous browser to Google's sign-in" console_behind_iap
check console-opens "the console opens for an operator through IAP" console_opens
STAGE="done"

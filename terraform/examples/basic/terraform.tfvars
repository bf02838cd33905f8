# This deployment's variables: the one file every apply reads, Cloud Build's and a laptop's alike
# (Terraform loads terraform.tfvars from the directory it runs in), so neither undoes the other.
# Fill it once and commit it; only the image's tag is given on the command line. Cloud Build
# refuses a build whose project or region is not this file's (its check-vars step).
project_id = "my-project"
region     = "europe-west1"

# Who may act as the operator account on the admin service: "user:EMAIL" or "group:EMAIL".
operators = []

# Cloud Monitoring notification channels for the alerts (projects/P/notificationChannels/ID).
notification_channels = []

# syntax=docker/dockerfile:1.7
# One image, both services and the CLI: Cloud Run runs /usr/local/bin/drip-limiter or
# drip-dispatcher, and a Cloud Run job can run /usr/local/bin/drip (inspect, limits) in the VPC.

FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
# Dependencies first, in their own layer: manifests and empty targets (every member's sources and
# declared targets stubbed by stub-workspace.sh), built once per lock change. ./run test runs this
# stage's steps as plain commands (tools/docker/run_stage.py), so a manifest or target it lacks fails there.
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY shared/batch/Cargo.toml shared/batch/
COPY shared/core/Cargo.toml shared/core/
COPY shared/store/Cargo.toml shared/store/
COPY shared/gcp/Cargo.toml shared/gcp/
COPY shared/service/Cargo.toml shared/service/
COPY functions/limiter/Cargo.toml functions/limiter/
COPY functions/dispatcher/Cargo.toml functions/dispatcher/
COPY cli/Cargo.toml cli/
COPY tools/demo/Cargo.toml tools/demo/
COPY tests/Cargo.toml tests/
COPY tests/cloud-tasks-emulator/Cargo.toml tests/cloud-tasks-emulator/
COPY tests/pubsub-emulator-client/Cargo.toml tests/pubsub-emulator-client/
COPY tools/docker/stub-workspace.sh tools/docker/
RUN sh tools/docker/stub-workspace.sh \
 && cargo build --release --locked -p drip-limiter -p drip-dispatcher -p drip-cli \
 && rm -rf shared functions cli tools tests
COPY . .
RUN touch shared/*/src/lib.rs functions/*/src/*.rs cli/src/*.rs \
 && cargo build --release --locked -p drip-limiter -p drip-dispatcher -p drip-cli

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /src/target/release/drip-limiter /src/target/release/drip-dispatcher /src/target/release/drip /usr/local/bin/
# 65532 is distroless's nonroot user, numeric so the platform can check it is not root.
USER 65532:65532
ENV DRIP_LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/drip-limiter"]

# syntax=docker/dockerfile:1
# leader-elector image: a release build on Debian bookworm (glibc), run as
# the non-root user 65532 on distroless (no shell, no package manager).
#
#   docker build -t leader-elector .

FROM rust:1-bookworm AS build
# protoc: etcd-client's build script compiles etcd's protobuf definitions.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cache mounts keep the registry and build artefacts between builds; the
# binary is copied out of the cached target/ before the layer ends.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
 && install -D -m 0755 target/release/leader-elector /out/leader-elector

# cc: glibc, libgcc and CA certificates; the :nonroot tag runs as 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/leader-elector /usr/local/bin/leader-elector
USER 65532:65532
# mimalloc gives freed pages back to the OS at once instead of after a delay
# that only a later allocation would act on: RSS returns to idle after a burst
# of connections (benches/longpoll_memory.rs, issue 13).
ENV MIMALLOC_PURGE_DELAY=0
# Read-only HTTP API: /leader, /, /isLeader, /healthz, /readyz, /metrics.
EXPOSE 4040
ENTRYPOINT ["/usr/local/bin/leader-elector"]

# syntax=docker/dockerfile:1
# leader-elector image: a release build on Debian bookworm (glibc), run as
# the non-root user 65532 on distroless (no shell, no package manager).
#
#   docker build -t leader-elector .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/leader-elector:TAG --push .
#
# Multi-arch: both base images are published for amd64 and arm64; each
# platform builds natively (under QEMU when it is not the builder's), with a
# build cache of its own.

FROM rust:1-bookworm AS build
# protoc: etcd-client's build script compiles etcd's protobuf definitions.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cache mounts keep the registry and build artefacts between builds; the
# binary is copied out of the cached target/ before the layer ends.
ARG TARGETPLATFORM
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,id=leader-elector-target-${TARGETPLATFORM} \
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
# ... and commits its first arena on demand instead of eagerly: idle RSS 11.0
# instead of 15.8 MiB, 14.5 instead of 21.5 MiB under 5,000 long-polls (same
# bench, release build). .cargo/config.toml makes that the build's default
# too; the variable keeps it when the build ran with a CFLAGS of its own.
ENV MIMALLOC_ARENA_EAGER_COMMIT=0
# Read-only HTTP API: /leader, /, /isLeader, /healthz, /readyz, /metrics.
EXPOSE 4040
ENTRYPOINT ["/usr/local/bin/leader-elector"]

# syntax=docker/dockerfile:1
# leader-elector image for those with a Docker engine: a release build on
# Debian bookworm (glibc), run as the non-root user 65532 on distroless (no
# shell, no package manager). CI has no engine and builds the image with
# scripts/build-image instead (buildah, FROM scratch, out of the same Debian
# packages distroless/cc is made of); both give the same user, paths,
# environment, port and labels, which scripts/check-image compares with this
# file's final stage.
#
#   docker build -t ghcr.io/leader-elector/leader-elector:0.1.0 \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) \
#     --build-arg CREATED=$(date -u -d @$(git log -1 --format=%ct) +%Y-%m-%dT%H:%M:%SZ) .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/leader-elector:TAG --push .
#
# Multi-arch: both base images are published for amd64 and arm64; each
# platform builds natively (under QEMU when it is not the builder's), with a
# build cache of its own.

FROM rust:1-bookworm AS build
# protoc: etcd-client's build script compiles etcd's protobuf definitions;
# jq: scripts/sbom.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler jq \
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
# The SBOM (CycloneDX, from Cargo.lock; cargo-cyclonedx is installed into the
# cached .tools/cargo on first use), as scripts/build-image makes it.
ARG SOURCE_DATE_EPOCH=0
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/.tools,id=leader-elector-tools-${TARGETPLATFORM} \
    scripts/sbom --epoch "${SOURCE_DATE_EPOCH}" --output /out/leader-elector.cdx.json

# cc: glibc, libgcc and CA certificates; the :nonroot tag runs as 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/leader-elector /usr/local/bin/leader-elector
COPY --from=build /out/leader-elector.cdx.json /usr/share/doc/leader-elector/leader-elector.cdx.json
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
# The labels scripts/build-image sets (from Cargo.toml and git): pass
# REVISION and CREATED (the commit's time) as build arguments.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL \
  org.opencontainers.image.title="leader-elector" \
  org.opencontainers.image.description="Kubernetes leader-election sidecar: one active replica at a time, on etcd, Redis or a Kubernetes Lease, with fencing tokens" \
  org.opencontainers.image.version="${VERSION}" \
  org.opencontainers.image.revision="${REVISION}" \
  org.opencontainers.image.source="https://github.com/leader-elector/leader-elector" \
  org.opencontainers.image.licenses="Apache-2.0" \
  org.opencontainers.image.created="${CREATED}"
ENTRYPOINT ["/usr/local/bin/leader-elector"]

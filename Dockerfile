# syntax=docker/dockerfile:1
#
# The gpuscale image: the one binary, run as `gpuscale gateway ...` or
# `gpuscale autoscaler ...` or `gpuscale agent` (deploy/ passes the arguments).
#
#   docker build -t REGISTRY/gpuscale:0.1.0 .
#
# No container engine runs on gpuscale's development and CI machines, so
# this file is never built there: it is kept correct by reading it against
# .ci/run, which builds the same code with the same Debian packages for
# HiGHS and checks Cargo.lock is current (clippy --locked). CI builds the
# test profile, not this release one (fat LTO). Change both together.

# The toolchain .ci/run's machines build with; Debian 12, like the runtime
# image, so the binary's glibc and libstdc++ are the runtime's.
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# HiGHS (good_lp's solver) builds from source: cmake, and libclang for
# bindgen (as .ci/run installs them; gcc and g++ come with the image).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        cmake libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The release profile of Cargo.toml (fat LTO, one codegen unit): about ten
# minutes on 2 cores. --locked: exactly the dependencies of Cargo.lock.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin gpuscale \
    && cp target/release/gpuscale /usr/local/bin/gpuscale

# glibc, libgcc and libstdc++ (HiGHS is C++), CA certificates, no shell;
# the `nonroot` user is uid 65532, the one every manifest in deploy/ runs as.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/gpuscale /usr/local/bin/gpuscale
USER 65532:65532
# gateway traffic, gateway admin, autoscaler admin, KEDA external scaler, node agent
EXPOSE 8080 9090 9091 9092 9401
ENTRYPOINT ["/usr/local/bin/gpuscale"]
CMD ["--help"]

# YARL-rs: yarl-root and Debian 12's nginx with ngx_http_yarl_module, in one image.
#
#   docker build -t yarl-rs .
#
# The build stage runs the Makefile targets CI runs (`make build`, `make distro-module`,
# `make install`), so `make test` exercises every step of it (packaging/t/packaging.t checks
# that the targets exist and that `make install` lays out what the runtime stage copies).
# The module is built against the configured nginx source Debian ships in nginx-dev, with
# the arguments of the build stage's `nginx -V`; the runtime stage installs the same Debian
# nginx and refuses to build if the module does not load into it (`nginx -t`).
#
# Build arguments (`--build-arg NAME=VALUE`), all optional:
#   BASE_IMAGE           the build stage's base (default debian:12)
#   RUNTIME_IMAGE        the runtime stage's base (default debian:12-slim); both Debian 12:
#                        the module is built for the build stage's nginx package and loaded
#                        by the runtime stage's
#   RUST_FROM            where Rust comes from: rustup (default; rustup-init from
#                        static.rust-lang.org, then the RUST_TOOLCHAIN channel) or debian
#                        (Debian's rustc-web and cargo-web: nothing beyond the Debian mirror)
#   RUST_TOOLCHAIN       rustup's toolchain (default stable)
#   DEBIAN_RUST_RELEASE  with RUST_FROM=debian, the suite to take them from (`apt-get -t`;
#                        default the newest available, bookworm-security's; `bookworm` for
#                        1.85, the oldest Debian 12 toolchain, which some crates in
#                        Cargo.lock need newer than today: home, icu_*, idna_adapter)
#   PROFILE              release (default) or debug
# A `vendor/` directory in the context (`cargo vendor --locked vendor`, matching Cargo.lock)
# replaces crates.io: the build then fetches no crates. Use the legacy builder
# (`DOCKER_BUILDKIT=0`) where the buildx plugin is missing.
# `make docker-image` builds it without an image registry or crates.io inside containers:
# a debootstrap base, vendored crates, Debian's toolchain (packaging/docker/images.sh).
#
# Run (see README "Install / Docker"):
#   docker network create yarl
#   docker run -d --name yarl-root --network yarl -p 127.0.0.1:7700:7700 \
#       -v yarl-data:/var/lib/yarl -v yarl-sync:/var/lib/yarl-sync yarl-rs
#   docker run -d --name yarl-nginx --network yarl -p 127.0.0.1:8080:8080 \
#       -e YARL_ROOTS=http://yarl-root:7700 -v yarl-sync:/var/lib/yarl-sync:ro \
#       -v "$PWD/packaging/nginx-yarl.conf:/etc/nginx/conf.d/yarl.conf:ro" yarl-rs nginx

ARG BASE_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

############################################################################ build
FROM ${BASE_IMAGE} AS build
# Marks this stage's images, so that packaging/docker/images.sh can drop the build stages of
# earlier sources (untagged) and keep the disk use bounded.
LABEL org.yarl-rs.stage=build
ARG RUST_FROM=rustup
ARG RUST_TOOLCHAIN=stable
ARG DEBIAN_RUST_RELEASE=
ARG PROFILE=release
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_TERM_COLOR=never
RUN set -e; \
    apt-get update; \
    case "$RUST_FROM" in \
    rustup) \
        apt-get install -y --no-install-recommends ca-certificates curl make; \
        url=https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init; \
        curl --proto '=https' --tlsv1.2 -sSf -o /tmp/rustup-init "$url"; \
        echo "$(curl --proto '=https' --tlsv1.2 -sSf "$url.sha256" | cut -c1-64)  /tmp/rustup-init" \
            | sha256sum -c -; \
        chmod +x /tmp/rustup-init; \
        /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain "$RUST_TOOLCHAIN"; \
        rm /tmp/rustup-init ;; \
    debian) \
        apt-get install -y --no-install-recommends ${DEBIAN_RUST_RELEASE:+-t "$DEBIAN_RUST_RELEASE"} \
            ca-certificates make rustc-web cargo-web ;; \
    *) \
        echo "RUST_FROM must be rustup or debian, not '$RUST_FROM'" >&2; \
        exit 1 ;; \
    esac; \
    rustc --version
WORKDIR /src
COPY . .
# Vendored crates, when the context has them, in place of crates.io.
RUN if [ -d vendor ]; then \
        mkdir -p /root/.cargo \
        && printf '%s\n' '[source.crates-io]' 'replace-with = "vendored"' \
            '[source.vendored]' 'directory = "/src/vendor"' >>/root/.cargo/config.toml \
        && echo "crates from vendor/ ($(ls vendor | wc -l) crates)"; \
    fi
# Build dependencies (apt), then yarl-root, then the module for Debian's nginx (installs nginx
# and nginx-dev, configures the source with `nginx -V`'s arguments, builds into
# target/distro and test-loads the module), then a staged install under /out.
RUN make deps
RUN make build PROFILE=${PROFILE}
RUN make distro-module PROFILE=${PROFILE}
RUN make install PROFILE=${PROFILE} DESTDIR=/out PREFIX=/usr MODULE=distro

############################################################################ runtime
FROM ${RUNTIME_IMAGE}
LABEL org.yarl-rs.stage=runtime
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sf /dev/stdout /var/log/nginx/access.log \
    && ln -sf /dev/stderr /var/log/nginx/error.log \
    && useradd --system --home-dir /var/lib/yarl --shell /usr/sbin/nologin yarl \
    && install -d -o yarl -g yarl -m 0750 /var/lib/yarl /var/lib/yarl-sync \
    && install -d -o root -g yarl -m 0750 /etc/yarl

COPY --from=build /out/usr/bin/yarl-root /usr/bin/yarl-root
COPY --from=build /out/usr/bin/yarl-s3-app /usr/bin/yarl-s3-app
COPY --from=build /out/usr/lib/nginx/modules/ngx_http_yarl_module.so /usr/lib/nginx/modules/ngx_http_yarl_module.so
COPY --from=build /out/usr/share/nginx/modules-available/mod-http-yarl.conf /usr/share/nginx/modules-available/mod-http-yarl.conf
COPY --from=build /out/etc/default/yarl-root /etc/default/yarl-root
COPY --from=build /out/usr/share/doc/yarl/ /usr/share/doc/yarl/
COPY packaging/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh

# Enable the module the Debian way and prove it loads into this image's nginx.
RUN ln -s /usr/share/nginx/modules-available/mod-http-yarl.conf \
        /etc/nginx/modules-enabled/50-mod-http-yarl.conf \
    && nginx -t \
    && yarl-root --version \
    && yarl-s3-app --version

ENV YARL_LISTEN=0.0.0.0:7700 \
    YARL_DB=sqlite:///var/lib/yarl/yarl.db \
    NO_COLOR=1
# The root's database and admin token; the sync token apart, the one volume nginx and
# application containers get.
VOLUME ["/var/lib/yarl", "/var/lib/yarl-sync"]
EXPOSE 7700 80 8080
# Health checks depend on the role: `--health-cmd 'curl -fs http://127.0.0.1:7700/healthz'`
# for a root, `--health-cmd 'curl -fs -o /dev/null http://127.0.0.1:8080/yarl/stats'` (or
# any location of the site) for nginx.
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["yarl-root"]

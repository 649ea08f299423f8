# YARL-rs: `make run` to try it, `make test` to test everything. Both install what is
# missing first (Debian 12, as root).

SHELL := /bin/bash
CARGO ?= cargo
PROFILE ?= debug
# Cargo's target dir: CARGO_TARGET_DIR when set, ./target otherwise; exported so cargo and
# the paths below always agree.
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
export CARGO_TARGET_DIR := $(TARGET_DIR)
OUT := $(TARGET_DIR)/$(PROFILE)
CARGO_PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

# Debian packages the build and the tests need: bindgen's libclang and the headers the
# vendored nginx compiles against; PostgreSQL for the database tests; curl for `make run`;
# python3-venv for schemathesis's virtualenv. scripts/apt-install.sh installs the missing
# ones and leaves the services they bring stopped and disabled, and PostgreSQL without a
# main cluster: the tests run their own, on loopback.
APT_PACKAGES := build-essential pkg-config libclang-dev libpcre2-dev libssl-dev zlib1g-dev \
	postgresql curl perl openssl python3-prometheus-client python3-venv iproute2 nftables
# Prometheus and promtool for the alert-rule tests and t/yarl_prometheus.t, without the
# node exporter it recommends (a daemon the tests do not need).
APT_PACKAGES_NO_RECOMMENDS := prometheus

MODULE_SO := $(OUT)/ngx_http_yarl_module.so
ROOT_BIN := $(OUT)/yarl-root
# The S3-style application behind nginx in `make run` (examples/s3-app).
S3_APP_BIN := $(OUT)/yarl-s3-app
# The nginx the `ngx` crate builds from its bundled source (vendored feature).
NGINX_BIN = $(shell ls -t $(OUT)/build/nginx-sys-*/out/objs/nginx 2>/dev/null | head -n 1)

.PHONY: all deps build lint unit-test hostile-test schemathesis-deps schemathesis-test prove alert-rules-test chaos chaos-short measure-concurrency test run bench bench-nginx bench-root \
	bench-tower clean distro-deps distro-module distro-test packaging-test install \
	docker-deps docker-image docker-test docker-cluster docker-cluster-down sim

# The module for an installed nginx (Debian 12's 1.22.1 by default; any nginx whose source
# of the same version is at DISTRO_NGINX_SRC): built with NGINX_BUILD_DIR in its own target
# dir, since a cdylib's file name has no hash and would overwrite the vendored build's.
DISTRO_NGINX ?= /usr/sbin/nginx
DISTRO_NGINX_SRC ?= /usr/share/nginx/src
DISTRO_TARGET_DIR ?= $(TARGET_DIR)/distro
DISTRO_NGINX_BUILD := $(DISTRO_TARGET_DIR)/nginx
DISTRO_OUT := $(DISTRO_TARGET_DIR)/$(PROFILE)
DISTRO_MODULE_SO := $(DISTRO_OUT)/ngx_http_yarl_module.so
# t/ files that only make sense with the vendored build, with the reason (none so far: every
# test writes its pid, logs and temp paths under its own directory, see t/lib/Test/Yarl.pm).
DISTRO_TEST_SKIP :=
DISTRO_TESTS := $(filter-out $(DISTRO_TEST_SKIP),$(sort $(wildcard t/*.t)))

# make install: PREFIX/DESTDIR as usual. MODULE=distro installs the module built for
# DISTRO_NGINX into that nginx's modules directory (its --modules-path) and enables it the
# Debian way; MODULE=vendored installs the vendored build (for the nginx the ngx crate
# builds; tests only) under $(PREFIX)/lib/yarl and enables nothing.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
DATADIR ?= $(PREFIX)/share
DOCDIR ?= $(DATADIR)/doc/yarl
SYSCONFDIR ?= /etc
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
SYSUSERS_DIR ?= $(PREFIX)/lib/sysusers.d
MODULE ?= distro
NGINX_MODULES_DIR ?= $(or $(shell $(DISTRO_NGINX) -V 2>&1 | tr ' ' '\n' | sed -n 's/^--modules-path=//p'),/usr/lib/nginx/modules)
NGINX_CONF_DIR ?= $(SYSCONFDIR)/nginx
NGINX_ENABLE_MODULE ?= yes

all: build

deps:
	@scripts/apt-install.sh $(APT_PACKAGES)
	@scripts/apt-install.sh --no-install-recommends $(APT_PACKAGES_NO_RECOMMENDS)
	@command -v $(CARGO) >/dev/null || { echo "deps: cargo is missing (install Rust with rustup)"; exit 1; }

build: deps
	$(CARGO) build --workspace $(CARGO_PROFILE_FLAG)
	cp $(OUT)/libngx_http_yarl_module.so $(MODULE_SO)
	@echo "built: $(ROOT_BIN) $(MODULE_SO) $$(ls -t $(OUT)/build/nginx-sys-*/out/objs/nginx 2>/dev/null | head -n 1)"

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(CARGO_PROFILE_FLAG) -- -D warnings

# Unit, property, router and storage tests; the PostgreSQL ones against a throwaway cluster
# (YARL_TEST_PG_REQUIRED=1: they fail instead of skipping if it is not there). Includes the
# root's hostile-input suite and security tests against real yarl-root processes
# (root-server/tests/hostile.rs, security.rs).
unit-test: build
	YARL_TEST_PG_REQUIRED=1 scripts/with-postgres.sh $(CARGO) test --workspace $(CARGO_PROFILE_FLAG)

# Just the root's hostile-input and security suites (a real root process each), with figures.
hostile-test: deps
	$(CARGO) test -p yarl-root $(CARGO_PROFILE_FLAG) --test hostile --test security -- --nocapture

# End-to-end: a real nginx with the module, a real yarl-root and (the S3 example) the
# application built from examples/s3-app, nginx-tests style.
# T=t/yarl_x.t runs one file.
T ?= t/
prove: build
	TEST_NGINX_BINARY=$(NGINX_BIN) TEST_YARL_MODULE=$(MODULE_SO) TEST_YARL_ROOT=$(ROOT_BIN) \
		TEST_YARL_S3_APP=$(S3_APP_BIN) prove --timer $(T)

# The shipped Prometheus alert rules: syntax, then their unit tests (input series an
# incident leaves, the alerts that must fire). t/yarl_prometheus.t evaluates them live.
alert-rules-test: deps
	promtool check rules packaging/prometheus/yarl-alerts.yml
	cd packaging/prometheus && promtool test rules yarl-alerts.test.yml
	promtool check config --syntax-only packaging/prometheus/prometheus.yml


# schemathesis (PyPI), pinned, in its own virtualenv in the target dir: it fuzzes the admin
# API against the OpenAPI document the root serves (scripts/schemathesis-test.sh).
SCHEMATHESIS_VERSION := 4.32.5
SCHEMATHESIS_VENV := $(TARGET_DIR)/schemathesis-venv
SCHEMATHESIS := $(SCHEMATHESIS_VENV)/bin/schemathesis

schemathesis-deps: deps
	@if "$(SCHEMATHESIS)" --version 2>/dev/null | grep -qx "schemathesis, version $(SCHEMATHESIS_VERSION)"; then \
		echo "schemathesis-deps: schemathesis $(SCHEMATHESIS_VERSION) present"; \
	else \
		echo "schemathesis-deps: installing schemathesis $(SCHEMATHESIS_VERSION) into $(SCHEMATHESIS_VENV)"; \
		python3 -m venv "$(SCHEMATHESIS_VENV)" \
			&& "$(SCHEMATHESIS_VENV)/bin/pip" install -q "schemathesis==$(SCHEMATHESIS_VERSION)"; \
	fi

# The admin API against its OpenAPI document: a real root on loopback with tokens, every
# schemathesis check, the stateful phase over the document's links; about 15 s once built.
# ST_SEED, ST_MAX_EXAMPLES and ST_ARGS are passed on (see the script).
schemathesis-test: schemathesis-deps
	$(CARGO) build -p yarl-root $(CARGO_PROFILE_FLAG)
	ROOT_BIN=$(ROOT_BIN) SCHEMATHESIS=$(SCHEMATHESIS) scripts/schemathesis-test.sh


# Faults on real processes in network namespaces (needs root): 2 roots on PostgreSQL, 3
# nginx, cuts, loss, kills and restarts; prints per fault what was admitted, false
# rejections, convergence and the balance. See scripts/chaos.py and docs/operations.md.
CHAOS = scripts/with-postgres.sh python3 scripts/chaos.py --nginx $(NGINX_BIN) \
	--module $(MODULE_SO) --root $(ROOT_BIN)

# 15 s of recovery after each fault (the short suite: 8): "hot after" is read over it, and
# over 7 s the bucket's level at the window's two ends alone moves it by a few percent.
chaos: build
	$(CHAOS) --strict --recovery 15

chaos-short: build
	$(CHAOS) --short

# A cluster-wide cap on requests in flight on real processes (2 nginx x 2 workers, 2 roots,
# max_in_flight 50, a slow upstream counting what it runs): cap, utilisation, shares moving
# with the traffic, a killed nginx's share coming back (docs/concurrency.md). About 2 minutes.
# MEASURE_ARGS="--keys 10" measures caps per key under a template instead.
measure-concurrency: build
	scripts/with-postgres.sh python3 scripts/measure-concurrency.py --nginx $(NGINX_BIN) \
		--module $(MODULE_SO) --root $(ROOT_BIN) $(MEASURE_ARGS)

test: lint unit-test alert-rules-test schemathesis-test prove chaos-short distro-test packaging-test

run: build
	NGINX_BIN=$(NGINX_BIN) MODULE_SO=$(MODULE_SO) ROOT_BIN=$(ROOT_BIN) S3_APP_BIN=$(S3_APP_BIN) \
		scripts/run.sh

bench: deps
	$(CARGO) bench -p yarl-core --bench limiter --bench root --bench reseed

# Side-by-side nginx benchmark (release build, wrk): plain, limit_req and yarl variants as
# locations of one nginx, 1M quotas, 1 and 2 workers, the limiter's memory. Prints figures;
# not part of `make test`. See scripts/bench-nginx.sh.
REL := $(TARGET_DIR)/release
bench-nginx: deps
	@command -v wrk >/dev/null && command -v bc >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk bc; }
	$(MAKE) build PROFILE=release
	NGINX_BIN=$$(ls -t $(REL)/build/nginx-sys-*/out/objs/nginx | head -n 1) \
		MODULE_SO=$(REL)/ngx_http_yarl_module.so ROOT_BIN=$(REL)/yarl-root \
		scripts/bench-nginx.sh

# Side-by-side tower benchmark (release build, wrk): an axum hello-world with no layer,
# with tower-governor, and with yarl-tower (one quota; a random quota across 1M) syncing
# with a real root. Prints figures; not part of `make test`. See scripts/bench-tower.sh.
bench-tower: deps
	@command -v wrk >/dev/null && command -v bc >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk bc; }
	$(CARGO) build --release -p yarl-root
	$(CARGO) build --release -p yarl-tower --example bench_server --example layer_cost
	ROOT_BIN=$(REL)/yarl-root BENCH_SERVER=$(REL)/examples/bench_server \
		LAYER_COST=$(REL)/examples/layer_cost scripts/bench-tower.sh

# The root tier's capacity (release build): N simulated limiters with real sync messages
# against real yarl-root processes on loopback, 1M quotas loaded through the batch API,
# protocol v1 vs v2, 1 vs 2 shards. Prints a table; not part of `make test`. A few minutes;
# BENCH_ROOT_ARGS=--full for the big grid (1,000 limiters too). See bench/src/bench_root/main.rs.
BENCH_ROOT_ARGS ?=
bench-root: deps
	$(CARGO) build --release -p yarl-root -p yarl-bench
	$(REL)/bench-root --root-bin $(REL)/yarl-root --dir $(TARGET_DIR)/bench-root $(BENCH_ROOT_ARGS)

# nginx and nginx-dev from the distribution, without leaving nginx running or enabled.
distro-deps:
	packaging/install-distro-nginx.sh

distro-module: deps distro-deps
	packaging/configure-nginx.sh $(DISTRO_NGINX) $(DISTRO_NGINX_SRC) $(DISTRO_NGINX_BUILD)
	NGINX_BUILD_DIR=$(DISTRO_NGINX_BUILD)/objs CARGO_TARGET_DIR=$(DISTRO_TARGET_DIR) \
		$(CARGO) build -p ngx_http_yarl_module --no-default-features $(CARGO_PROFILE_FLAG)
	cp $(DISTRO_OUT)/libngx_http_yarl_module.so $(DISTRO_MODULE_SO)
	packaging/check-module-load.sh $(DISTRO_NGINX) $(DISTRO_MODULE_SO)
	@echo "built: $(DISTRO_MODULE_SO) for $(DISTRO_NGINX)"

# The end-to-end suite against the installed nginx loading the distro module.
distro-test: build distro-module
	TEST_NGINX_BINARY=$(DISTRO_NGINX) TEST_YARL_MODULE=$(DISTRO_MODULE_SO) TEST_YARL_ROOT=$(ROOT_BIN) \
		TEST_YARL_S3_APP=$(S3_APP_BIN) TEST_NGINX_GLOBALS='lock_file %%TESTDIR%%/nginx.lock;' \
		prove --timer $(DISTRO_TESTS)

# The Dockerfile's build stage calls only existing targets; `make install` lays out what the
# Dockerfile's runtime stage and the systemd unit expect.
packaging-test: build distro-module
	PROFILE=$(PROFILE) TARGET_DIR=$(TARGET_DIR) prove --timer packaging/t/

install:
	@case "$(MODULE)" in \
		distro) so=$(DISTRO_MODULE_SO); hint="make distro-module" ;; \
		vendored) so=$(MODULE_SO); hint="make build" ;; \
		*) echo "install: MODULE must be distro or vendored, not '$(MODULE)'" >&2; exit 1 ;; \
	esac; \
	for f in $(ROOT_BIN) $(S3_APP_BIN) $$so; do \
		[ -f "$$f" ] || { echo "install: $$f is missing: run 'make build' and '$$hint' first (same PROFILE)" >&2; exit 1; }; \
	done
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(SYSTEMD_UNIT_DIR) \
		$(DESTDIR)$(SYSUSERS_DIR) $(DESTDIR)$(SYSCONFDIR)/default
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/yarl
	install -m 0755 $(ROOT_BIN) $(DESTDIR)$(BINDIR)/yarl-root
	@# The S3-style application of the example (examples/s3-app), which the Docker cluster
	@# runs behind each nginx as `make run` does.
	install -m 0755 $(S3_APP_BIN) $(DESTDIR)$(BINDIR)/yarl-s3-app
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
		packaging/yarl-root.service >$(DESTDIR)$(SYSTEMD_UNIT_DIR)/yarl-root.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/yarl-root.service
	install -m 0644 packaging/yarl.sysusers $(DESTDIR)$(SYSUSERS_DIR)/yarl.conf
	@# Installing into the live system, the group yarl must exist before the env file below
	@# can belong to it; a staged install (DESTDIR) leaves the user to the package or image.
	if [ -z "$(DESTDIR)" ] && command -v systemd-sysusers >/dev/null; then \
		systemd-sysusers $(SYSUSERS_DIR)/yarl.conf; \
	fi
	@# The env file is configuration: an existing one is kept, the new one lands beside it.
	@# It may hold a database password, so only root (systemd reads it) and the group yarl
	@# may read it.
	group=$$([ -z "$(DESTDIR)" ] && getent group yarl >/dev/null && echo yarl || true); \
	if [ -e $(DESTDIR)$(SYSCONFDIR)/default/yarl-root ]; then \
		install -m 0640 $${group:+-g $$group} packaging/yarl-root.env $(DESTDIR)$(SYSCONFDIR)/default/yarl-root.dist; \
		echo "install: kept $(DESTDIR)$(SYSCONFDIR)/default/yarl-root, new defaults in yarl-root.dist"; \
		[ -z "$$(find $(DESTDIR)$(SYSCONFDIR)/default/yarl-root -perm -o=r)" ] \
			|| echo "install: $(DESTDIR)$(SYSCONFDIR)/default/yarl-root is readable by every user; if it holds a password: chmod 0640 it, chgrp yarl"; \
	else \
		install -m 0640 $${group:+-g $$group} packaging/yarl-root.env $(DESTDIR)$(SYSCONFDIR)/default/yarl-root; \
	fi
	install -m 0644 nginx-conf/s3.conf packaging/nginx-yarl.conf packaging/yarl-root.env \
		$(DESTDIR)$(DOCDIR)/examples/
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(DOCDIR)/prometheus $(DESTDIR)$(DOCDIR)/grafana
	install -m 0644 packaging/prometheus/*.yml $(DESTDIR)$(DOCDIR)/prometheus/
	install -m 0644 packaging/grafana/*.json $(DESTDIR)$(DOCDIR)/grafana/
ifeq ($(MODULE),distro)
	install -d $(DESTDIR)$(NGINX_MODULES_DIR) $(DESTDIR)$(DATADIR)/nginx/modules-available
	install -m 0644 $(DISTRO_MODULE_SO) $(DESTDIR)$(NGINX_MODULES_DIR)/ngx_http_yarl_module.so
	echo 'load_module $(NGINX_MODULES_DIR)/ngx_http_yarl_module.so;' \
		>$(DESTDIR)$(DATADIR)/nginx/modules-available/mod-http-yarl.conf
ifeq ($(NGINX_ENABLE_MODULE),yes)
	install -d $(DESTDIR)$(NGINX_CONF_DIR)/modules-enabled
	ln -sfn $(DATADIR)/nginx/modules-available/mod-http-yarl.conf \
		$(DESTDIR)$(NGINX_CONF_DIR)/modules-enabled/50-mod-http-yarl.conf
endif
else
	install -d $(DESTDIR)$(PREFIX)/lib/yarl
	install -m 0644 $(MODULE_SO) $(DESTDIR)$(PREFIX)/lib/yarl/ngx_http_yarl_module.so
endif
	@echo "installed into $(or $(DESTDIR),/) (PREFIX=$(PREFIX), MODULE=$(MODULE))"

clean:
	$(CARGO) clean
	rm -rf .run

# Docker (README "Install / Docker"). The engine (Debian's docker.io, started by the scripts
# only when none answers), debootstrap for a local base image (no image registry needed) and
# docker-compose for the cluster; the image is built from vendored crates with Debian's
# toolchain by default (packaging/docker/images.sh: DOCKER_BASE, DOCKER_RUST).
DOCKER_APT_PACKAGES := docker.io debootstrap docker-compose

docker-deps:
	@missing=""; \
	for p in $(DOCKER_APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" \
			|| missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "docker-deps: installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "docker-deps: all present"; \
	fi

# The image yarl-rs:local, from a local base and vendored crates.
docker-image: docker-deps
	packaging/docker/images.sh

# Builds the images, runs a root and an nginx container and the cluster for real, and
# removes every container, network and volume it made (README: what it costs).
docker-test: docker-deps
	packaging/docker/test.sh

# Two roots on one PostgreSQL and two nginx with the S3 example, in containers; prints how
# to send traffic. `make docker-cluster-down` removes it.
docker-cluster: docker-deps
	packaging/docker/cluster.sh up

docker-cluster-down:
	packaging/docker/cluster.sh down

# Regenerates docs/accuracy.md and its figures (fixed seed). In .PHONY above: sim/ is a
# directory, which would otherwise make the target always up to date.
sim:
	$(CARGO) run --release -p yarl-sim -- --out docs

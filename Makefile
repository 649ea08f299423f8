# YARL-rs: `make run` to try it, `make test` to test everything. Both install what is
# missing first (Debian 12, as root).

SHELL := /bin/bash
CARGO ?= cargo
PROFILE ?= debug
TARGET_DIR ?= $(CURDIR)/target
OUT := $(TARGET_DIR)/$(PROFILE)
CARGO_PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

# Debian packages the build and the tests need: bindgen's libclang and the headers the
# vendored nginx compiles against; PostgreSQL for the database tests; curl for `make run`.
APT_PACKAGES := build-essential pkg-config libclang-dev libpcre2-dev libssl-dev zlib1g-dev \
	postgresql curl perl

MODULE_SO := $(OUT)/ngx_http_yarl_module.so
ROOT_BIN := $(OUT)/yarl-root
# The nginx the `ngx` crate builds from its bundled source (vendored feature).
NGINX_BIN = $(shell ls -t $(OUT)/build/nginx-sys-*/out/objs/nginx 2>/dev/null | head -n 1)

.PHONY: all deps build lint unit-test prove test run bench clean

all: build

deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" \
			|| missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "deps: all present"; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "deps: cargo is missing (install Rust with rustup)"; exit 1; }

build: deps
	$(CARGO) build --workspace $(CARGO_PROFILE_FLAG)
	cp $(OUT)/libngx_http_yarl_module.so $(MODULE_SO)
	@echo "built: $(ROOT_BIN) $(MODULE_SO) $(NGINX_BIN)"

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(CARGO_PROFILE_FLAG) -- -D warnings

# Unit, property, router and storage tests; the PostgreSQL ones against a throwaway cluster.
unit-test: build
	scripts/with-postgres.sh $(CARGO) test --workspace $(CARGO_PROFILE_FLAG)

# End-to-end: a real nginx with the module and a real yarl-root, nginx-tests style.
prove: build
	TEST_NGINX_BINARY=$(NGINX_BIN) TEST_YARL_MODULE=$(MODULE_SO) TEST_YARL_ROOT=$(ROOT_BIN) \
		prove --timer t/

test: lint unit-test prove

run: build
	NGINX_BIN=$(NGINX_BIN) MODULE_SO=$(MODULE_SO) ROOT_BIN=$(ROOT_BIN) scripts/run.sh

bench: deps
	$(CARGO) bench -p yarl-core --bench limiter

clean:
	$(CARGO) clean
	rm -rf .run

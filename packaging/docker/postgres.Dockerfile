# PostgreSQL for the cluster in containers (docker-compose.yml): Debian 12's postgresql on
# the same base as the YARL-rs image, so it builds without an image registry.
# Reachable only through its socket in the volume /run/postgresql (no TCP at all), where
# every client is trusted: mount that volume only into the roots.
ARG BASE_IMAGE=debian:12-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# No "main" cluster from the package: the entrypoint makes one in the volume.
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-common \
    && sed -ri 's/#?\s*(create_main_cluster) .*$/\1 = false/' /etc/postgresql-common/createcluster.conf \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres -m 2775 /run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:$PATH
VOLUME ["/var/lib/postgresql/data", "/run/postgresql"]
USER postgres
ENTRYPOINT ["postgres-entrypoint.sh"]

# The Docker stack (docker-compose.yml); included by the Makefile.
# SHOP_LOCK_BACKEND picks the lock backend of all three instances:
#   SHOP_LOCK_BACKEND=zookeeper make up
COMPOSE ?= docker compose

.PHONY: up down compose-loadtest

up: .env ## Build and start the Docker stack: 3 shop instances behind nginx on :8080, every backend, Prometheus :9090, Grafana :3000
	$(COMPOSE) up -d --build

# The stack runs SHOP_ENV=production, which refuses the public dev secrets:
# fresh random ones, once per checkout, in the .env compose reads.
.env:
	umask 077 && printf 'SHOP_JWT_SECRET=%s\nSHOP_ADMIN_TOKEN=%s\n' "$$(openssl rand -hex 32)" "$$(openssl rand -hex 32)" > $@

down: ## Stop the Docker stack and delete its volumes (the MariaDB data)
	$(COMPOSE) --profile loadtest down -v --remove-orphans

compose-loadtest: ## Run the k6 flows through the Docker stack's load balancer and print the audit (after make up)
	deploy/loadtest.sh

// Package deploytest holds no code, only tests: they check the Docker and
// Kubernetes deployments (docker-compose.yml, Dockerfile, deploy/) against
// the service's code without a Docker engine or a cluster, so that `go
// test ./...` catches a compose file or a manifest that names a variable
// config no longer reads, an address of a server that is not in the stack,
// a probe on a route that does not exist, a dashboard panel or an alert
// querying a metric nobody registers, or an image build that is no longer
// static.
//
// The compose file is loaded with compose-go, the loader docker compose
// itself uses, and the Kustomizations are built with kustomize's own API:
// "it loads here" means docker compose and kubectl would accept them.
package deploytest
